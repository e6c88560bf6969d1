//! [`WireCounter`] counts round trips on the wire: a TCP proxy on loopback
//! between a client and its server, so a test asserts what the network
//! sees, not what the server's own statistics (which cannot see a
//! protocol-level ping) report.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

/// Which way bytes last went on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

#[derive(Debug, Default)]
struct Counts {
    exchanges: AtomicU64,
    to_server_bytes: AtomicU64,
    to_client_bytes: AtomicU64,
    connections: AtomicU64,
    /// Exchanges on each connection, in the order they were opened.
    by_connection: std::sync::Mutex<Vec<Arc<AtomicU64>>>,
    /// Milliseconds every chunk waits before it is forwarded.
    delay_ms: AtomicU64,
}

/// A counting TCP proxy: listen on 127.0.0.1, forward to `target`.
///
/// An *exchange* starts each time a client sends after the server last
/// spoke on that connection (or at its first send): a request and its
/// answer, however many segments either takes, is one exchange; a
/// follow-up message such as a connection pool's ping after use is another.
/// So "exactly one round trip per decision" is `exchanges` growing by one.
#[derive(Debug, Clone)]
pub struct WireCounter {
    addr: SocketAddr,
    counts: Arc<Counts>,
}

impl WireCounter {
    /// Starts a proxy to `target` on a free loopback port. Must be called
    /// inside a tokio runtime, which then runs the proxy until it ends.
    pub async fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let shared = counts.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counts = shared.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        counts.connections.fetch_add(1, Ordering::SeqCst);
                        let mine = Arc::new(AtomicU64::new(0));
                        counts
                            .by_connection
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(mine.clone());
                        relay(client, server, counts, mine).await;
                    }
                });
            }
        });
        Ok(WireCounter { addr, counts })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Exchanges seen on every connection so far.
    pub fn exchanges(&self) -> u64 {
        self.counts.exchanges.load(Ordering::SeqCst)
    }

    /// Bytes the clients sent.
    pub fn bytes_to_server(&self) -> u64 {
        self.counts.to_server_bytes.load(Ordering::SeqCst)
    }

    /// Bytes the server sent.
    pub fn bytes_to_client(&self) -> u64 {
        self.counts.to_client_bytes.load(Ordering::SeqCst)
    }

    /// Connections the proxy opened to the server.
    pub fn connections(&self) -> u64 {
        self.counts.connections.load(Ordering::SeqCst)
    }

    /// Exchanges seen on each connection so far, in the order the
    /// connections were opened: how a client spreads its calls.
    pub fn exchanges_by_connection(&self) -> Vec<u64> {
        self.counts
            .by_connection
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|n| n.load(Ordering::SeqCst))
            .collect()
    }

    /// Holds every chunk read from now on, either way, for `delay` before
    /// forwarding it: a slow network (zero, the default, forwards at once).
    pub fn set_delay(&self, delay: std::time::Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.counts.delay_ms.store(ms, Ordering::SeqCst);
    }
}

/// Waits for the delay set by [`WireCounter::set_delay`], if any.
async fn delayed(counts: &Counts) {
    let ms = counts.delay_ms.load(Ordering::SeqCst);
    if ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

async fn relay(client: TcpStream, server: TcpStream, counts: Arc<Counts>, mine: Arc<AtomicU64>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let last = Arc::new(Mutex::new(None::<Direction>));
    let up = {
        let (counts, last) = (counts.clone(), last.clone());
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                {
                    let mut l = last.lock().await;
                    if *l != Some(Direction::ToServer) {
                        counts.exchanges.fetch_add(1, Ordering::SeqCst);
                        mine.fetch_add(1, Ordering::SeqCst);
                    }
                    *l = Some(Direction::ToServer);
                }
                counts.to_server_bytes.fetch_add(n as u64, Ordering::SeqCst);
                delayed(&counts).await;
                if sw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = sw.shutdown().await;
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            *last.lock().await = Some(Direction::ToClient);
            counts.to_client_bytes.fetch_add(n as u64, Ordering::SeqCst);
            delayed(&counts).await;
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server answering each message: two requests, two exchanges,
    /// whatever the segmenting.
    #[tokio::test]
    async fn counts_request_answer_exchanges() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut buf = [0u8; 16];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n]).await.unwrap();
            }
        });
        let counter = WireCounter::start(target).await.unwrap();
        let mut c = TcpStream::connect(counter.addr()).await.unwrap();
        for msg in [&b"ping"[..], b"pong"] {
            c.write_all(msg).await.unwrap();
            let mut got = [0u8; 4];
            c.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, msg);
        }
        assert_eq!(counter.exchanges(), 2);
        assert_eq!(counter.bytes_to_server(), 8);
        assert_eq!(counter.bytes_to_client(), 8);
        assert_eq!(counter.connections(), 1);
        assert_eq!(counter.exchanges_by_connection(), [2]);
    }
}
