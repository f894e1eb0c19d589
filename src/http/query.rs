//! Query strings and percent-decoding.

/// Splits a raw query (`a=1&b&c=x%20y`) into percent-decoded pairs; a flag
/// without `=` has an empty value. `+` is kept as is (consul, like Go's
/// `url.ParseQuery`, decodes `+` as space: so does this).
pub fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    todo!("{query}");
    #[allow(unreachable_code)]
    std::iter::empty()
}

/// Percent-decodes bytes; `None` for a malformed escape. `+` stays `+`.
pub fn percent_decode(s: &str) -> Option<Vec<u8>> {
    todo!("{s}")
}
