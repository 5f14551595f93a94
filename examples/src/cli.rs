//! Value parsers the binaries' command lines (clap) share.

/// A whole number above 0 (`--threads 4`, `--tensors 100`); surrounding blanks are ignored.
///
/// # Errors
///
/// A message naming the value when it is not such a number.
pub fn positive(value: &str) -> Result<usize, String> {
    value
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("`{value}` is not a positive whole number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_takes_whole_numbers_above_zero() {
        assert_eq!(positive("3"), Ok(3));
        assert_eq!(positive(" 64 "), Ok(64));
        for bad in ["0", "-1", "1.5", "x", ""] {
            assert!(positive(bad).is_err(), "{bad:?}");
        }
    }
}
