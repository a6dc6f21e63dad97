//! A server with its admin endpoint, on a runtime of its own, and a
//! minimal HTTP/1.1 client for the admin API.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;

use admin_api::paths::PathPolicy;
use admin_api::{Admin, AdminOptions};
use server::{Config, Server};

/// The token of the servers `start` runs (unless told another).
pub const TOKEN: &str = "test-token-0123456789";

pub struct Running {
    /// The first portal.
    pub iscsi: SocketAddr,
    /// Every portal.
    pub portals: Vec<SocketAddr>,
    pub admin: SocketAddr,
    /// The admin Unix socket.
    pub socket: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    th: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.th.take().unwrap().join().unwrap();
    }
}

/// Serves the configuration at `path` with the admin endpoint (token
/// `token`, default [`TOKEN`]); the admin socket and directory are beside
/// the file.
pub fn start(path: &Path, token: Option<&str>) -> Running {
    let cfg = Config::from_file(path).unwrap();
    let dir = path.parent().unwrap().to_path_buf();
    let socket = dir.join("admin.sock");
    let sock = socket.clone();
    let path = path.to_path_buf();
    let token = token.unwrap_or(TOKEN).to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let th = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let paths = PathPolicy::from_config(&cfg, &dir);
            let s = Server::bind(cfg).await.unwrap();
            let a = Admin::bind(
                AdminOptions {
                    listen: "127.0.0.1:0".parse().unwrap(),
                    token,
                    socket: Some(sock),
                    allowed_hosts: Vec::new(),
                    metrics_open: false,
                    paths,
                    config_path: Some(path),
                },
                s.control(),
            )
            .await
            .unwrap();
            tx.send((s.local_addrs(), a.local_addr().unwrap())).unwrap();
            tokio::spawn(a.run());
            s.run(async move {
                let _ = stop_rx.await;
            })
            .await;
        });
    });
    let (portals, admin) = rx.recv().unwrap();
    Running {
        iscsi: portals[0],
        portals,
        admin,
        socket,
        stop: Some(stop_tx),
        th: Some(th),
    }
}

/// A request with the bearer token `token` (default [`TOKEN`]) and a
/// proper Host; returns the status and the body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    let auth = format!("Authorization: Bearer {}\r\n", token.unwrap_or(TOKEN));
    raw(
        addr,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Sends `request` as written; returns the status and the body.
pub fn raw(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    answer(&mut s)
}

/// Reads a whole answer (the server closes after it).
pub fn answer(s: &mut impl Read) -> (u16, String) {
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let code = r[9..12].parse().unwrap();
    let body = r.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    (code, body)
}
