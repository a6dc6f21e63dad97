//! Human sizes: `4096`, `64M`, `1G`, `1GiB`, `2T`, in powers of 1024. The
//! parsing is the `parse-size` crate's, in binary units, as everywhere in
//! ironsan that takes a size (the bench's gpfsperf options too).

/// Parses a size in bytes with an optional K/M/G/T suffix (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| format!("not a size: {s:?} ({e}; try 4096, 64M, 1G)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("3072MB"), Ok(3 << 30));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
