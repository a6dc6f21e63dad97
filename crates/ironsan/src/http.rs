//! A minimal HTTP/1.1 client for the admin endpoint (JSON over loopback or
//! a trusted network): one request per connection, `Connection: close`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Where the admin endpoint is and how to authenticate.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `host:port`.
    pub addr: String,
    pub token: Option<String>,
}

impl Endpoint {
    /// From `http://host:port[/]` or `host:port`.
    pub fn parse(url: &str, token: Option<String>) -> Result<Endpoint> {
        let rest = url.strip_prefix("http://").unwrap_or(url);
        if url.starts_with("https://") {
            bail!("{url}: https is not supported; put a TLS proxy in front or use an SSH tunnel");
        }
        let addr = rest.trim_end_matches('/').to_string();
        if addr.is_empty() || addr.contains('/') {
            bail!("{url}: expected http://HOST:PORT");
        }
        Ok(Endpoint { addr, token })
    }

    /// Sends `method path` with an optional JSON body; returns the status
    /// and the body.
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
        let mut s = TcpStream::connect(&self.addr)
            .with_context(|| format!("connecting to the admin endpoint {}", self.addr))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json\r\n",
            self.addr
        );
        if let Some(t) = &self.token {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
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
        assert!(Endpoint::parse("https://x:1", None).is_err());
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:9260/", None)
                .unwrap()
                .addr,
            "127.0.0.1:9260"
        );
    }
}
