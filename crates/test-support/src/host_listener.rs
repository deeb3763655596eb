//! A listener on every address of the host, counting what connects: what
//! a sandbox reaching the host would show, whatever the sandbox believes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A listener on every address of the host (`0.0.0.0`) that counts the
/// connections it accepts: what a sandbox reaching the host would show,
/// whatever the sandbox itself believes.
pub struct HostListener {
    listener: Arc<std::net::TcpListener>,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl HostListener {
    pub fn start() -> HostListener {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").expect("host listener");
        listener.set_nonblocking(true).expect("nonblocking");
        let listener = Arc::new(listener);
        let accepted = Arc::new(AtomicUsize::new(0));
        let (l, n) = (listener.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            loop {
                match l.accept() {
                    Ok(_) => {
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    Err(_) => return,
                }
            }
        });
        HostListener {
            listener,
            accepted,
            task,
        }
    }

    pub fn port(&self) -> u16 {
        self.listener.local_addr().expect("addr").port()
    }

    /// Stops accepting; returns how many connections were accepted,
    /// counting those still queued in the kernel (a completed handshake
    /// is a connection, accepted or not).
    pub async fn stop(self) -> usize {
        self.task.abort();
        let _ = self.task.await;
        let mut n = self.accepted.load(Ordering::SeqCst);
        while self.listener.accept().is_ok() {
            n += 1;
        }
        n
    }
}
