//! A server with its admin endpoint, on a runtime of its own, and a
//! minimal HTTP/1.1 client for the admin API.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;

use target::admin::{Admin, AdminOptions};
use target::{Config, Server};

pub struct Running {
    /// The first portal.
    pub iscsi: SocketAddr,
    /// Every portal.
    pub portals: Vec<SocketAddr>,
    pub admin: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    th: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.th.take().unwrap().join().unwrap();
    }
}

pub fn start(path: &Path, token: Option<&str>) -> Running {
    let cfg = Config::from_file(path).unwrap();
    let path = path.to_path_buf();
    let token = token.map(str::to_string);
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let th = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let s = Server::bind(cfg).await.unwrap();
            let a = Admin::bind(
                AdminOptions {
                    listen: "127.0.0.1:0".parse().unwrap(),
                    token,
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
        stop: Some(stop_tx),
        th: Some(th),
    }
}

pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let code = r[9..12].parse().unwrap();
    let body = r.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    (code, body)
}
