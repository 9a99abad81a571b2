//! A minimal busybox root filesystem for the real container runtimes (runc, podman, docker),
//! and an HTTP client for the web server it is made to run.
//!
//! ```text
//! busybox_rootfs(dir)        dir/bin/busybox (copy of Debian's busybox-static /bin/busybox),
//!                            dir/bin/<applet> -> busybox for every applet (sh, httpd, nc, sleep,
//!                            ip, ...), dir/etc/{passwd,group}, dir/www/index.html (INDEX_HTML),
//!                            empty dir/{dev,proc,sys,tmp,root}
//! set_index_html(dir, body)  replaces dir/www/index.html, to tell containers apart
//! busybox_tarball(path)      the same tree as a tar file (`podman import` / `docker import`)
//! HTTPD_ARGS                 the container's process: busybox httpd serving /www on port 80
//! http_get / http_wait       GET / from inside a network namespace
//! ```

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use super::in_netns;

/// Debian's `busybox-static` binary (statically linked, so it runs in an empty rootfs).
pub const BUSYBOX: &str = "/bin/busybox";

/// The container's command line: busybox httpd in the foreground on port 80, serving `/www`
/// (whose `index.html` is what [`http_get`] returns).
pub const HTTPD_ARGS: [&str; 6] = ["/bin/httpd", "-f", "-p", "80", "-h", "/www"];

/// `www/index.html` as [`busybox_rootfs`] writes it.
pub const INDEX_HTML: &str = "natledger busybox\n";

/// Names of busybox's applets (`busybox --list`), read once.
fn applets() -> &'static [String] {
    static APPLETS: OnceLock<Vec<String>> = OnceLock::new();
    APPLETS.get_or_init(|| {
        let out = Command::new(BUSYBOX)
            .arg("--list")
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run `{BUSYBOX} --list` (install busybox-static): {e}")
            });
        assert!(
            out.status.success(),
            "`{BUSYBOX} --list` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|n| !n.is_empty() && *n != "busybox" && !n.contains('/'))
            .map(str::to_string)
            .collect();
        for needed in ["sh", "httpd", "nc", "sleep", "ip"] {
            assert!(
                names.iter().any(|n| n == needed),
                "{BUSYBOX} has no `{needed}` applet; applets: {names:?}"
            );
        }
        names
    })
}

fn write(path: &Path, contents: &str) {
    std::fs::write(path, contents)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// Builds a busybox root filesystem in `dir` (created if missing; must not already hold one):
/// `bin/busybox`, a relative symlink `bin/<applet> -> busybox` for every applet, `etc/passwd`
/// and `etc/group` (root, nobody), `www/index.html` ([`INDEX_HTML`]) and the empty mount points
/// `dev`, `proc`, `sys`, `tmp` (1777), `root`. Panics with the path on any failure.
pub fn busybox_rootfs(dir: &Path) {
    for sub in ["bin", "dev", "etc", "proc", "root", "sys", "tmp", "www"] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
    }
    let tmp = dir.join("tmp");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))
        .unwrap_or_else(|e| panic!("chmod 1777 {}: {e}", tmp.display()));
    let bin = dir.join("bin");
    std::fs::copy(BUSYBOX, bin.join("busybox"))
        .unwrap_or_else(|e| panic!("cannot copy {BUSYBOX} into {}: {e}", bin.display()));
    for applet in applets() {
        let link = bin.join(applet);
        std::os::unix::fs::symlink("busybox", &link)
            .unwrap_or_else(|e| panic!("cannot create symlink {}: {e}", link.display()));
    }
    write(
        &dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    );
    write(&dir.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n");
    set_index_html(dir, INDEX_HTML);
}

/// Replaces `www/index.html` of the rootfs in `dir` with `body` (what [`http_get`] returns).
pub fn set_index_html(dir: &Path, body: &str) {
    write(&dir.join("www/index.html"), body);
}

/// Writes a tar file at `path` holding a [`busybox_rootfs`] (entries `./bin/busybox`, ...,
/// owned by root), ready for `podman import PATH IMAGE` / `docker import PATH IMAGE`.
pub fn busybox_tarball(path: &Path) {
    let tmp = tempfile::tempdir().expect("tempdir for the busybox rootfs");
    busybox_rootfs(tmp.path());
    let out = Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(tmp.path())
        .arg("-cf")
        .arg(path)
        .arg(".")
        .output()
        .unwrap_or_else(|e| panic!("cannot run tar: {e}"));
    assert!(
        out.status.success(),
        "tar -cf {} failed ({}): {}",
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// From network namespace `ns`: `GET /` over HTTP/1.0 to `dst`; returns the body of a
/// `200` reply. Any other status is an error naming the status line. `timeout` bounds the
/// connect and each read and write. Panics if `ns` cannot be entered.
pub fn http_get(ns: &str, dst: SocketAddr, timeout: Duration) -> io::Result<String> {
    let timeout = timeout.max(Duration::from_millis(1));
    in_netns(ns, move || {
        let mut stream = TcpStream::connect_timeout(&dst, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.write_all(format!("GET / HTTP/1.0\r\nHost: {dst}\r\n\r\n").as_bytes())?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply)?;
        let reply = String::from_utf8_lossy(&reply);
        let (head, body) = reply.split_once("\r\n\r\n").ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{dst}: not an HTTP reply: {reply:?}"),
            )
        })?;
        let status = head.lines().next().unwrap_or_default();
        if status.split_whitespace().nth(1) != Some("200") {
            return Err(io::Error::other(format!("{dst}: {status}")));
        }
        Ok(body.to_string())
    })
}

/// Retries [`http_get`] from `ns` to `dst` until the body equals `expect` (a container that
/// is still starting refuses connections), for at most `timeout`. On timeout the error
/// says what the last attempt got.
pub fn http_wait(ns: &str, dst: SocketAddr, expect: &str, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = http_get(ns, dst, Duration::from_secs(1));
        if attempt.as_deref().is_ok_and(|body| body == expect) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let got = match attempt {
                Ok(body) => format!("body {body:?}"),
                Err(e) => format!("error: {e}"),
            };
            return Err(format!(
                "GET http://{dst}/ from {ns}: expected {expect:?} within {timeout:?}; last attempt: {got}"
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
}
