//! Pseudo-terminals for PTY processes (E2B's `StartRequest.pty`).
//!
//! envd keeps the master side: its output is the process's output (one
//! stream, `DataEvent.pty`), input (`SendInput` with `pty` bytes) is
//! written to it, and `Update` resizes it (the kernel then sends
//! `SIGWINCH` to the terminal's foreground group). The slave side becomes
//! the process's stdin, stdout and stderr, and its controlling terminal
//! (`warren_sys::controlling_terminal_from_stdin`).
//!
//! The master is non-blocking and read through Tokio's reactor. Once every
//! slave descriptor is closed (the process and whatever it started have
//! exited), reading the master fails with `EIO`: that is the end of output.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, ReadBuf};

/// A terminal size, as the SDK sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

impl Size {
    /// A size from the request's `uint32`s: each must be 1..=65535 (what
    /// the kernel's `winsize` holds; 0 would give programs no room at all).
    pub fn new(cols: u32, rows: u32) -> Result<Size, String> {
        let dim = |v: u32, what: &str| {
            u16::try_from(v)
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| format!("pty.size.{what} must be between 1 and 65535, not {v}"))
        };
        Ok(Size {
            cols: dim(cols, "cols")?,
            rows: dim(rows, "rows")?,
        })
    }

    fn winsize(self) -> rustix::termios::Winsize {
        rustix::termios::Winsize {
            ws_row: self.rows,
            ws_col: self.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }
    }
}

/// The master side of a process's terminal.
#[derive(Debug, Clone)]
pub struct Master {
    fd: Arc<AsyncFd<OwnedFd>>,
}

/// Opens a new terminal of `size`: the master (non-blocking, registered with
/// the reactor) and the slave, to hand to the process.
pub fn open(size: Size) -> io::Result<(Master, OwnedFd)> {
    use rustix::pty::OpenptFlags;
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    // By descriptor rather than by `/dev/pts/N` path: nothing in the
    // sandbox can swap the node in between.
    let slave = rustix::pty::ioctl_tiocgptpeer(
        &master,
        OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC,
    )?;
    rustix::termios::tcsetwinsize(&slave, size.winsize())?;
    let flags = rustix::fs::fcntl_getfl(&master)?;
    rustix::fs::fcntl_setfl(&master, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok((
        Master {
            fd: Arc::new(warren_sys::async_fd(master)?),
        },
        slave,
    ))
}

impl Master {
    /// Changes the terminal's size.
    pub fn resize(&self, size: Size) -> io::Result<()> {
        rustix::termios::tcsetwinsize(self.fd.get_ref(), size.winsize()).map_err(io::Error::from)
    }

    /// Writes all of `data` as if typed on the terminal.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| rustix::io::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// A reader of the terminal's output.
    pub fn reader(&self) -> Reader {
        Reader {
            fd: self.fd.clone(),
        }
    }
}

/// Reads what the process writes to its terminal; `EIO` (no slave left
/// open) reads as the end.
#[derive(Debug)]
pub struct Reader {
    fd: Arc<AsyncFd<OwnedFd>>,
}

impl AsyncRead for Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| {
                rustix::io::read(fd.get_ref().as_fd(), &mut *unfilled).map_err(io::Error::from)
            }) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        assert_eq!(Size::new(80, 24), Ok(Size { cols: 80, rows: 24 }));
        assert!(Size::new(0, 24).unwrap_err().contains("cols"));
        assert!(Size::new(80, 70_000).unwrap_err().contains("rows"));
    }
}
