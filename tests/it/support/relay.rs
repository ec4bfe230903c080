//! A TCP relay on 127.0.0.1 that delays every byte by a fixed time each
//! way: a Redis "a zone away" (0.5-2 ms), on loopback. Bytes keep their
//! order and are not slowed down in bulk: each chunk is sent on at the time
//! it was read plus the delay, as a link of that latency would. Runs on a
//! thread of its own, so tests that block do not hold it up; dropped, it
//! stops listening and closes its connections.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

pub struct Relay {
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    /// Relays 127.0.0.1:<port> to `to`, `delay` each way.
    pub fn start(to: SocketAddr, delay: Duration) -> Relay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                let accept = async {
                    loop {
                        let Ok((client, _)) = listener.accept().await else {
                            continue;
                        };
                        tokio::spawn(async move {
                            let Ok(server) = TcpStream::connect(to).await else {
                                return;
                            };
                            let _ = client.set_nodelay(true);
                            let _ = server.set_nodelay(true);
                            let (cr, cw) = client.into_split();
                            let (sr, sw) = server.into_split();
                            tokio::join!(pump(cr, sw, delay), pump(sr, cw, delay));
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
        });
        Relay {
            port,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// Copies `from` to `to`, each chunk sent `delay` after it was read.
async fn pump(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, delay: Duration) {
    let (chunks, mut queued) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if chunks.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let write = async move {
        while let Some((at, bytes)) = queued.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
