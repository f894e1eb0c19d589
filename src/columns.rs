//! Plain-text tables for the operator commands (`status`, `wait-drained`).
//!
//! In: rows of cells, the header first. Out: one line per row, each column
//! padded to its widest cell (counted in chars), two spaces between
//! columns, no trailing spaces. Always holds: pure.

/// A count with its noun: `1 error`, `2 errors`, `0 errors`.
pub fn counted(n: usize, one: &str, many: &str) -> String {
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// The rows as aligned lines, each ending in `\n`.
pub fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(s, w)| format!("{s:w$}"))
            .collect();
        text += cells.join("  ").trim_end();
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_are_padded_to_the_widest_cell_without_trailing_spaces() {
        let rows = [["A", "BB", "C"], ["ééé", "", ""]].map(|r| r.map(str::to_owned));
        assert_eq!(super::aligned(&rows), "A    BB  C\nééé\n");
    }
}
