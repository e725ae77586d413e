//! The web config as the files say now: as the exporter toolkit does, a change to the file,
//! or to a certificate, key or CA file it names, takes effect without a restart. Each new
//! connection (its TLS handshake) and each request (its basic auth) asks for the config;
//! the files (a few KiB) are read then, and parsed and checked again only when the bytes of
//! one changed. Comparing bytes rather than modification times also sees a change made
//! within the same clock tick, or one that kept the time.
//!
//! A file that became unusable is never worked around: until it is fixed, handshakes fail
//! and requests get 500, and the log says why once per change. Serving on with the last
//! good config instead would keep a password or a certificate that was just withdrawn.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::web_config::{self, BadWebConfig, WebConfig};

/// The web config file of a running endpoint.
#[derive(Debug)]
pub(crate) struct LiveConfig {
    path: PathBuf,
    /// Whether the port speaks TLS: decided at start, as the toolkit does (the listener's
    /// clients expect one or the other).
    tls: bool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The files the config was read from, each as it was just before.
    files: Vec<(PathBuf, Contents)>,
    current: Reading,
}

/// A file's bytes, `None` where it cannot be read.
type Contents = Option<Vec<u8>>;

/// What a reading of the files gave.
type Reading = Result<Arc<WebConfig>, BadWebConfig>;

fn contents(path: &Path) -> Contents {
    std::fs::read(path).ok()
}

impl LiveConfig {
    /// Reads `path` for the first time.
    ///
    /// # Errors
    /// What makes the file unusable, in one line.
    pub(crate) fn load(path: &Path) -> Result<Self, BadWebConfig> {
        let (files, current) = read(path, &[]);
        let current = current?;
        Ok(Self {
            path: path.to_owned(),
            tls: current.tls.is_some(),
            state: Mutex::new(State {
                files,
                current: Ok(current),
            }),
        })
    }

    /// Whether the port speaks TLS.
    #[must_use]
    pub(crate) fn tls(&self) -> bool {
        self.tls
    }

    /// What it asks for, for the log: `TLS, basic auth for 2 users (--web.config.file PATH)`.
    #[must_use]
    pub(crate) fn describe(&self) -> String {
        let users = self.current().map_or(0, |config| config.users.len());
        let mut asks = Vec::new();
        if self.tls {
            asks.push("TLS".to_owned());
        }
        if users > 0 {
            asks.push(format!(
                "basic auth for {users} user{}",
                if users == 1 { "" } else { "s" }
            ));
        }
        if asks.is_empty() {
            asks.push("neither TLS nor basic auth".to_owned());
        }
        format!(
            "{} (--web.config.file {})",
            asks.join(", "),
            self.path.display()
        )
    }

    /// The config the files hold now, read again if one of them changed since it was last
    /// read; why it cannot be used, when it cannot.
    ///
    /// # Errors
    /// The file (or one it names) is unusable now.
    pub(crate) fn current(&self) -> Result<Arc<WebConfig>, BadWebConfig> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = state
            .files
            .iter()
            .any(|(path, before)| contents(path) != *before);
        if changed {
            let (files, current) = read(&self.path, &state.files);
            let current = current.and_then(|config| {
                if config.tls.is_some() == self.tls {
                    Ok(config)
                } else {
                    Err(BadWebConfig(format!(
                        "--web.config.file {}: tls_server_config was {}: this port speaks {} \
                         until tap-probe restarts",
                        self.path.display(),
                        if self.tls { "removed" } else { "added" },
                        if self.tls { "TLS" } else { "plain HTTP" },
                    )))
                }
            });
            match &current {
                Ok(_) => log::info!("{}: read again after a change", self.path.display()),
                Err(err) => {
                    log::error!("{err} (connections and requests are refused until it is fixed)");
                }
            }
            state.files = files;
            state.current = current;
        }
        state.current.clone()
    }
}

/// Reads the config, with its files' bytes as they were just before: those of `known` (the
/// files of the last reading) are taken before it is parsed, so a change while it is shows
/// next time; a file the config names for the first time is taken after.
fn read(path: &Path, known: &[(PathBuf, Contents)]) -> (Vec<(PathBuf, Contents)>, Reading) {
    let before: Vec<(&Path, Contents)> = std::iter::once(path)
        .chain(known.iter().map(|(file, _)| file.as_path()))
        .map(|file| (file, contents(file)))
        .collect();
    let (files, result) = web_config::read(path);
    let files = files
        .into_iter()
        .map(|file| {
            let bytes = before
                .iter()
                .find(|(seen, _)| *seen == file)
                .map_or_else(|| contents(&file), |(_, bytes)| bytes.clone());
            (file, bytes)
        })
        .collect();
    (files, result.map(Arc::new))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `text` to `path` as editors and renewers do: elsewhere, then renamed over it.
    fn replace(path: &Path, text: &str) {
        let new = path.with_extension("new");
        std::fs::write(&new, text).unwrap();
        std::fs::rename(&new, path).unwrap();
    }

    fn key_pair(dir: &Path) {
        let server = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        replace(&dir.join("tls.crt"), &server.cert.pem());
        replace(&dir.join("tls.key"), &server.signing_key.serialize_pem());
    }

    #[test]
    fn a_change_to_the_file_or_to_a_file_it_names_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        key_pair(dir.path());
        let tls = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n";
        let user = |name: &str| format!("  {name}: {}\n", bcrypt::hash("pw", 4).unwrap());
        replace(&path, &format!("{tls}basic_auth_users:\n{}", user("a")));
        let live = LiveConfig::load(&path).unwrap();
        assert!(live.tls());
        let first = live.current().unwrap();
        assert!(
            Arc::ptr_eq(&first, &live.current().unwrap()),
            "unchanged files are not parsed again"
        );

        // A user added.
        replace(
            &path,
            &format!("{tls}basic_auth_users:\n{}{}", user("a"), user("b")),
        );
        assert_eq!(live.current().unwrap().users.len(), 2);
        // The certificate renewed, the config untouched: a new TLS config, from the new pair.
        let before = live.current().unwrap();
        key_pair(dir.path());
        let renewed = live.current().unwrap();
        assert!(!Arc::ptr_eq(&before, &renewed));
        // Edited in place: seen by its bytes, whatever the clock.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("  c: ");
        text.push_str(&bcrypt::hash("pw", 4).unwrap());
        text.push('\n');
        std::fs::write(&path, &text).unwrap();
        assert_eq!(live.current().unwrap().users.len(), 3);

        // Broken: refused until fixed, saying why.
        std::fs::write(&path, format!("{tls}basic_auth_users:\n  a: plain\n")).unwrap();
        let broken = live.current().unwrap_err().to_string();
        assert!(
            broken.contains("basic_auth_users.a: not a bcrypt hash"),
            "{broken}"
        );
        assert_eq!(
            live.current().unwrap_err().to_string(),
            broken,
            "until fixed"
        );
        std::fs::write(&path, format!("{tls}basic_auth_users:\n{}", user("a"))).unwrap();
        assert_eq!(live.current().unwrap().users.len(), 1);
        // A key that no longer matches: fixed by the key file alone.
        let other = rcgen::KeyPair::generate().unwrap();
        replace(&dir.path().join("tls.key"), &other.serialize_pem());
        let mismatch = live.current().unwrap_err().to_string();
        assert!(
            mismatch.contains("is not the key of the certificate"),
            "{mismatch}"
        );
        key_pair(dir.path());
        assert!(live.current().is_ok());

        // TLS is the port's for its life.
        replace(&path, &format!("basic_auth_users:\n{}", user("a")));
        let removed = live.current().unwrap_err().to_string();
        assert!(
            removed.ends_with(
                "tls_server_config was removed: this port speaks TLS until tap-probe restarts"
            ),
            "{removed}"
        );
    }
}
