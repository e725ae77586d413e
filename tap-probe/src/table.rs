//! Aligned text columns, for every table tap-probe prints: each column as wide as its
//! widest cell, two spaces between columns, no trailing blanks.

/// How a column's cells are padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// Rows of cells. Rows may be shorter than others; a row's last cell is not padded when it
/// is left-aligned, so long free text at the end of a row does not widen the others.
#[derive(Debug, Default)]
pub(crate) struct Table {
    indent: &'static str,
    /// Alignment per column; columns beyond are left-aligned.
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table whose columns are aligned as `align` says (left beyond it).
    #[must_use]
    pub(crate) fn new(align: &[Align]) -> Self {
        Self {
            indent: "",
            align: align.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Every line starts with `indent`.
    #[must_use]
    pub(crate) fn indent(mut self, indent: &'static str) -> Self {
        self.indent = indent;
        self
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The lines, each ending in a newline.
    #[must_use]
    pub(crate) fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|row| row.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::from(self.indent);
            for (c, cell) in row.iter().enumerate() {
                if c > 0 {
                    line.push_str("  ");
                }
                let pad = widths[c].saturating_sub(cell.chars().count());
                match self.align.get(c).copied().unwrap_or(Align::Left) {
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(cell);
                    }
                    Align::Left => {
                        line.push_str(cell);
                        if c + 1 < row.len() {
                            line.extend(std::iter::repeat_n(' ', pad));
                        }
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_lines_do_not_trail() {
        let mut t = Table::new(&[Align::Left, Align::Right]).indent("  ");
        t.row(vec!["a".into(), "1".into(), "x".into()]);
        t.row(vec!["bbb".into(), "100".into(), "long text".into()]);
        t.row(vec!["c".into()]);
        assert_eq!(t.render(), "  a      1  x\n  bbb  100  long text\n  c\n");
    }
}
