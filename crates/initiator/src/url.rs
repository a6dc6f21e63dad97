//! `iscsi://[user[%secret]@]host[:port][/target-iqn[/lun]][?target_user=U&target_password=P]`
//! URLs, as libiscsi writes them. The user and secret are CHAP credentials;
//! `target_user`/`target_password` (or the environment variables
//! `LIBISCSI_CHAP_TARGET_USERNAME`/`LIBISCSI_CHAP_TARGET_PASSWORD`, as
//! libiscsi reads them) ask for mutual CHAP.

use std::fmt;
use std::str::FromStr;

/// A parsed iSCSI URL. `Debug` does not show secrets.
#[derive(Clone, PartialEq, Eq)]
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
    /// Mutual CHAP: the target's user and secret.
    pub target_chap: Option<(String, String)>,
}

impl fmt::Debug for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Url")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("target", &self.target)
            .field("lun", &self.lun)
            .field("chap_user", &self.chap.as_ref().map(|c| &c.0))
            .field("target_chap_user", &self.target_chap.as_ref().map(|c| &c.0))
            .field("header_digest", &self.header_digest)
            .field("data_digest", &self.data_digest)
            .finish()
    }
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

impl Url {
    /// The URL with everything [`FromStr`] reads back: CHAP credentials and
    /// the query parameters, which `Display` leaves out so that secrets do
    /// not reach logs and reports. For handing a URL to another process
    /// (the multi-node bench's job).
    pub fn to_full_string(&self) -> String {
        let mut s = String::from("iscsi://");
        if let Some((u, p)) = &self.chap {
            s += &format!("{u}%{p}@");
        }
        s += &self.addr();
        if let Some(t) = &self.target {
            s += &format!("/{t}");
            if let Some(l) = self.lun {
                s += &format!("/{l}");
            }
        }
        let mut q = Vec::new();
        if self.header_digest {
            q.push("header_digest=crc32c".to_string());
        }
        if self.data_digest {
            q.push("data_digest=crc32c".to_string());
        }
        if let Some((u, p)) = &self.target_chap {
            q.push(format!("target_user={u}"));
            q.push(format!("target_password={p}"));
        }
        if !q.is_empty() {
            s += "?";
            s += &q.join("&");
        }
        s
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
        let (mut tu, mut tp) = (None, None);
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            match kv.split_once('=') {
                Some(("header_digest", v)) => {
                    header_digest = v.to_ascii_lowercase().starts_with("crc32c")
                }
                Some(("data_digest", v)) => {
                    data_digest = v.to_ascii_lowercase().starts_with("crc32c")
                }
                Some(("target_user", v)) => tu = Some(v.to_string()),
                Some(("target_password", v)) => tp = Some(v.to_string()),
                _ => {
                    return Err(bad(
                        "unknown URL parameter; known: header_digest, data_digest, target_user, target_password",
                    ))
                }
            }
        }
        let target_chap = match (tu, tp) {
            (Some(u), Some(p)) if !u.is_empty() && !p.is_empty() => Some((u, p)),
            (None, None) => None,
            _ => return Err(bad("target_user and target_password go together")),
        };
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
            target_chap,
        })
    }
}

impl Url {
    /// The login configuration for this URL: CHAP from the credentials,
    /// mutual CHAP from `target_user`/`target_password` or, failing those,
    /// `LIBISCSI_CHAP_TARGET_USERNAME`/`LIBISCSI_CHAP_TARGET_PASSWORD`.
    /// `target` overrides the URL's target; `None` with no target in the
    /// URL is a discovery login.
    pub fn login_config(
        &self,
        initiator: &str,
        target: Option<&str>,
    ) -> iscsi_proto::initiator::LoginConfig {
        use iscsi_proto::chap::{Credential, Secret};
        use iscsi_proto::initiator::{LoginConfig, MutualChap};
        let target = target.or(self.target.as_deref());
        let mut cfg = LoginConfig::new(initiator, target, crate::random_isid());
        cfg.header_digest = self.header_digest;
        cfg.data_digest = self.data_digest;
        cfg.chap = self
            .chap
            .as_ref()
            .map(|(u, p)| Credential::new(u, p.as_bytes()));
        let env = || {
            let u = std::env::var("LIBISCSI_CHAP_TARGET_USERNAME").ok()?;
            let p = std::env::var("LIBISCSI_CHAP_TARGET_PASSWORD").ok()?;
            (!u.is_empty() && !p.is_empty()).then_some((u, p))
        };
        if cfg.chap.is_some() {
            if let Some((u, p)) = self.target_chap.clone().or_else(env) {
                let r = crate::random_bytes::<17>();
                cfg.mutual = Some(MutualChap {
                    user: Some(u),
                    secret: Secret::new(p.into_bytes()),
                    id: r[0],
                    challenge: r[1..].to_vec(),
                });
            }
        }
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_string_round_trips() {
        for u in [
            "iscsi://h/iqn.x/3",
            "iscsi://[::1]:3261/iqn.x",
            "iscsi://u%s3cr@t@10.0.0.1:3260/iqn.x/0?header_digest=crc32c&data_digest=crc32c&target_user=t&target_password=pw",
        ] {
            let a: Url = u.parse().unwrap();
            let b: Url = a.to_full_string().parse().unwrap();
            assert_eq!(a, b, "{u}");
        }
        let a: Url = "iscsi://u%secret@h/iqn.x/0".parse().unwrap();
        assert!(!a.to_string().contains("secret"));
    }

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
        let u: Url = "iscsi://bob%s3cret@h/iqn.a/0?target_user=t&target_password=tsecret"
            .parse()
            .unwrap();
        assert_eq!(u.target_chap, Some(("t".into(), "tsecret".into())));
        assert_eq!(u.target.as_deref(), Some("iqn.a"));
        assert!(!format!("{u:?}").contains("s3cret"));
        assert!("iscsi://h/iqn.a/0?target_user=t".parse::<Url>().is_err());
    }
}
