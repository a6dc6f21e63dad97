//! `iscsi://[user[%secret]@]host[:port][/target-iqn[/lun]]` URLs, as
//! libiscsi writes them.

use std::fmt;
use std::str::FromStr;

/// A parsed iSCSI URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    pub target: Option<String>,
    pub lun: Option<u16>,
    /// CHAP user and secret.
    pub chap: Option<(String, String)>,
    /// `?header_digest=crc32c`: ask for CRC32C header digests.
    pub header_digest: bool,
    /// `?data_digest=crc32c`: ask for CRC32C data digests.
    pub data_digest: bool,
}

impl Url {
    /// `host:port` for connecting (IPv6 hosts in brackets).
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "iscsi://{}", self.addr())?;
        if let Some(t) = &self.target {
            write!(f, "/{t}")?;
            if let Some(l) = self.lun {
                write!(f, "/{l}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for Url {
    type Err = String;

    fn from_str(s: &str) -> Result<Url, String> {
        let bad = |why: &str| {
            format!("{s:?} is not an iSCSI URL ({why}); expected iscsi://host[:port]/iqn/lun")
        };
        let rest = s
            .strip_prefix("iscsi://")
            .ok_or_else(|| bad("no iscsi:// prefix"))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (mut header_digest, mut data_digest) = (false, false);
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            match kv.split_once('=') {
                Some(("header_digest", v)) => {
                    header_digest = v.to_ascii_lowercase().starts_with("crc32c")
                }
                Some(("data_digest", v)) => {
                    data_digest = v.to_ascii_lowercase().starts_with("crc32c")
                }
                _ => {
                    return Err(bad(
                        "unknown URL parameter; known: header_digest=crc32c, data_digest=crc32c",
                    ))
                }
            }
        }
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((a, r)) => (Some(a), r),
            None => (None, rest),
        };
        let chap = match auth {
            Some(a) => {
                let (u, p) = a
                    .split_once('%')
                    .ok_or_else(|| bad("credentials must be user%secret"))?;
                Some((u.to_string(), p.to_string()))
            }
            None => None,
        };
        let mut parts = rest.splitn(3, '/');
        let hostport = parts
            .next()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?;
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad("bad port"))?,
                None => 3260,
            };
            (h.to_string(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad("bad port"))?),
                None => (hostport.to_string(), 3260),
            }
        };
        let target = parts.next().filter(|t| !t.is_empty()).map(str::to_string);
        let lun = match parts.next().filter(|l| !l.is_empty()) {
            Some(l) => Some(l.parse::<u16>().map_err(|_| bad("bad LUN"))?),
            None => None,
        };
        Ok(Url {
            host,
            port,
            target,
            lun,
            chap,
            header_digest,
            data_digest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libiscsi_urls() {
        let u: Url = "iscsi://127.0.0.1:3261/iqn.2026-11.x:y/3".parse().unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.lun),
            ("127.0.0.1", 3261, Some(3))
        );
        assert_eq!(u.target.as_deref(), Some("iqn.2026-11.x:y"));
        assert_eq!(u.to_string(), "iscsi://127.0.0.1:3261/iqn.2026-11.x:y/3");
        let u: Url = "iscsi://bob%s3cret@[::1]/iqn.a/0".parse().unwrap();
        assert_eq!(u.addr(), "[::1]:3260");
        assert_eq!(u.chap, Some(("bob".into(), "s3cret".into())));
        let u: Url = "iscsi://host".parse().unwrap();
        assert_eq!((u.port, u.target, u.lun), (3260, None, None));
        assert!("http://x".parse::<Url>().is_err());
        assert!("iscsi://h:notaport/x".parse::<Url>().is_err());
        assert!("iscsi://h/iqn.a/lun".parse::<Url>().is_err());
        assert!("iscsi://u@h/iqn.a/0".parse::<Url>().is_err());
        let u: Url = "iscsi://h/iqn.a/0?header_digest=crc32c&data_digest=crc32c"
            .parse()
            .unwrap();
        assert!(u.header_digest && u.data_digest && u.lun == Some(0));
        assert!("iscsi://h/iqn.a/0?bogus=1".parse::<Url>().is_err());
    }
}
