//! A minimal HTTP/1.1 client for the admin endpoint (JSON over the admin
//! Unix socket, or over HTTP on loopback or a trusted network): one request
//! per connection, `Connection: close`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Where the admin endpoint is.
#[derive(Clone, Debug)]
pub enum Via {
    /// HTTP to `host:port`, with the token.
    Http { addr: String, token: String },
    /// The admin Unix socket (authenticated by the caller's user id).
    Socket(PathBuf),
}

/// Where the admin endpoint is and how to authenticate.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub via: Via,
}

impl Endpoint {
    /// From `http://host:port[/]` or `host:port`.
    pub fn parse(url: &str, token: String) -> Result<Endpoint> {
        let rest = url.strip_prefix("http://").unwrap_or(url);
        if url.starts_with("https://") {
            bail!("{url}: https is not supported; put a TLS proxy in front or use an SSH tunnel");
        }
        let addr = rest.trim_end_matches('/').to_string();
        if addr.is_empty() || addr.contains('/') {
            bail!("{url}: expected http://HOST:PORT");
        }
        Ok(Endpoint {
            via: Via::Http { addr, token },
        })
    }

    /// The admin socket at `path`.
    pub fn socket(path: PathBuf) -> Endpoint {
        Endpoint {
            via: Via::Socket(path),
        }
    }

    /// The HTTP address, if the endpoint is reached over HTTP.
    pub fn http_addr(&self) -> Option<&str> {
        match &self.via {
            Via::Http { addr, .. } => Some(addr),
            Via::Socket(_) => None,
        }
    }

    /// Sends `method path` with an optional JSON body; returns the status
    /// and the body.
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
        let (mut s, host, auth): (Box<dyn Stream>, &str, String) = match &self.via {
            Via::Http { addr, token } => {
                let s = TcpStream::connect(addr)
                    .with_context(|| format!("connecting to the admin endpoint {addr}"))?;
                s.set_read_timeout(Some(Duration::from_secs(30)))?;
                (
                    Box::new(s),
                    addr,
                    format!("Authorization: Bearer {token}\r\n"),
                )
            }
            Via::Socket(p) => {
                let s = UnixStream::connect(p).with_context(|| {
                    format!(
                        "connecting to the admin socket {} (is `ironsan serve --admin` running as this user, with this --state-dir?)",
                        p.display()
                    )
                })?;
                s.set_read_timeout(Some(Duration::from_secs(30)))?;
                (Box::new(s), "localhost", String::new())
            }
        };
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept: application/json\r\n{auth}"
        );
        if let Some(b) = body {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        req.push_str("\r\n");
        if let Some(b) = body {
            req.push_str(b);
        }
        s.write_all(req.as_bytes())?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        parse_response(&raw)
    }

    /// GET returning JSON, failing on a non-2xx status.
    pub fn get_json(&self, path: &str) -> Result<serde_json::Value> {
        let (code, body) = self.request("GET", path, None)?;
        check(code, &body)?;
        serde_json::from_str(&body).with_context(|| format!("{path}: not JSON"))
    }
}

/// A byte stream to the endpoint.
trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

/// Fails with the API's `{"error": …}` message on a non-2xx status.
pub fn check(code: u16, body: &str) -> Result<()> {
    if (200..300).contains(&code) {
        return Ok(());
    }
    let msg = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| body.trim().to_string());
    bail!("HTTP {code}: {msg}")
}

/// Splits a response into status and body (Content-Length or chunked).
fn parse_response(raw: &[u8]) -> Result<(u16, String)> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("truncated HTTP response")?;
    let head = std::str::from_utf8(&raw[..end]).context("HTTP header is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .context("bad HTTP status line")?;
    let chunked = lines.any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    let mut body = raw[end + 4..].to_vec();
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let nl = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .context("bad chunk")?;
            let n = usize::from_str_radix(std::str::from_utf8(&rest[..nl])?.trim(), 16)?;
            if n == 0 {
                break;
            }
            let start = nl + 2;
            out.extend_from_slice(rest.get(start..start + n).context("short chunk")?);
            rest = rest.get(start + n + 2..).unwrap_or(&[]);
        }
        body = out;
    }
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked() {
        let r = parse_response(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!(r, (201, "{}".into()));
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r, (200, "abcde".into()));
        assert!(Endpoint::parse("https://x:1", String::new()).is_err());
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:9260/", String::new())
                .unwrap()
                .http_addr(),
            Some("127.0.0.1:9260")
        );
    }
}
