//! Enums whose values are metric label values, declared once each.
//!
//! In: an enum's variants, each with its label. Out: the enum (doc comments
//! and derives passed through) and, on it, `ALL` (every value, in the order
//! the metrics are rendered), `label` and `index`. Always holds: `ALL` is in
//! declaration order and `index` is the position in `ALL`, so counters can
//! be plain arrays `[u64; T::ALL.len()]`. The labels are fixed: dashboards
//! and alerts outlive refactors.

/// Declares a fieldless enum with its label table:
///
/// ```text
/// label_enum! {
///     /// How one agent-check connection ended.
///     #[derive(Debug, Clone, Copy, PartialEq, Eq)]
///     pub enum Outcome {
///         Ready => "ready",
///         /// No complete consul read yet.
///         NotSynced => "not_synced",
///     }
/// }
/// ```
macro_rules! label_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$variant_meta:meta])*
                $variant:ident => $label:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $(
                $(#[$variant_meta])*
                $variant,
            )+
        }

        impl $name {
            /// Every value, in declaration order (the metrics' order).
            pub const ALL: [$name; [$($label),+].len()] = [$($name::$variant),+];

            /// The metric label value.
            pub fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }

            /// Position in [`Self::ALL`], for counters kept in a plain array.
            pub fn index(self) -> usize {
                self as usize
            }
        }
    };
}

pub(crate) use label_enum;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    label_enum! {
        /// Doc comments and derives pass through.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        enum Fruit {
            Apple => "apple",
            /// A variant's doc comment too.
            BloodOrange => "blood_orange",
            Fig => "fig",
        }
    }

    #[test]
    fn all_label_and_index_follow_the_declaration() {
        assert_eq!(Fruit::ALL, [Fruit::Apple, Fruit::BloodOrange, Fruit::Fig]);
        let labels: Vec<&str> = Fruit::ALL.iter().map(|f| f.label()).collect();
        assert_eq!(labels, ["apple", "blood_orange", "fig"]);
        for (i, f) in Fruit::ALL.iter().enumerate() {
            assert_eq!(f.index(), i, "{f:?}");
        }
        let counters = [0u64; Fruit::ALL.len()];
        assert_eq!(counters.len(), 3);
        assert_eq!(HashSet::from(Fruit::ALL).len(), 3);
    }
}
