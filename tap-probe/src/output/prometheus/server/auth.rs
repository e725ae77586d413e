//! Basic auth against the web config's users. bcrypt is slow on purpose (some 50 ms a
//! check at cost 10, ten times that under emulation), so:
//! - a check runs on a blocking thread, never on the thread that serves the connections,
//!   and one at a time: guesses cannot take more than one CPU;
//! - credentials that passed are remembered with the hash they passed against (as the
//!   exporter toolkit does), so a scraper pays for bcrypt once per password, not per
//!   scrape, and no guess can push it out of the way;
//! - while [`MAX_WAITING`] checks are waiting, further credentials nobody verified yet are
//!   refused at once, unchecked: a flood of guesses costs the server one CPU at most and
//!   delays no scrape whose credentials passed before;
//! - a user not in the file is checked against a hash of the file all the same, and then
//!   refused: the time a refusal takes does not tell which users exist.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use base64::Engine as _;

/// Checks that may wait for the one that runs; more are refused unchecked.
const MAX_WAITING: usize = 4;
/// Verified credentials remembered at most: more than any file has users (a password
/// changed in the file leaves its old entry behind, under the old hash, until this is
/// reached and they are all forgotten).
const REMEMBERED: usize = 64;

/// The outcome of a request's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No user is configured, or the request's user and password match.
    Allowed,
    /// Missing, malformed, unknown or wrong: 401.
    Denied,
}

/// Holds requests' credentials to the users' hashes.
#[derive(Debug)]
pub(crate) struct Verifier {
    /// (user, hash, password) that passed.
    passed: Mutex<HashSet<(String, String, String)>>,
    /// One bcrypt at a time.
    running: tokio::sync::Semaphore,
    /// Checks running or waiting to.
    pending: AtomicUsize,
}

impl Verifier {
    #[must_use]
    pub(crate) fn new() -> Self {
        Self {
            passed: Mutex::default(),
            running: tokio::sync::Semaphore::new(1),
            pending: AtomicUsize::new(0),
        }
    }

    /// Whether a request whose `Authorization` header is `header` may pass, given `users`
    /// (user to bcrypt hash).
    pub(crate) async fn check(
        &self,
        users: &BTreeMap<String, String>,
        header: Option<&[u8]>,
    ) -> Verdict {
        // The toolkit's rule: no users, no basic auth.
        let Some(any_hash) = users.values().next() else {
            return Verdict::Allowed;
        };
        let Some((user, password)) = header.and_then(credentials) else {
            return Verdict::Denied;
        };
        let (hash, known) = match users.get(&user) {
            Some(hash) => (hash, true),
            None => (any_hash, false),
        };
        let key = (user, hash.clone(), password);
        if known && self.remembered(&key) {
            return Verdict::Allowed;
        }
        let pending = Pending::enter(&self.pending);
        if pending.count > MAX_WAITING + 1 {
            log::debug!("basic auth: {MAX_WAITING} checks waiting, credentials refused unchecked");
            return Verdict::Denied;
        }
        let Ok(_permit) = self.running.acquire().await else {
            return Verdict::Denied;
        };
        let (password, hash) = (key.2.clone(), key.1.clone());
        let matched = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .is_ok_and(|verified| verified.unwrap_or(false));
        drop(pending);
        if known && matched {
            let mut passed = self.passed.lock().unwrap_or_else(PoisonError::into_inner);
            if passed.len() >= REMEMBERED {
                passed.clear();
            }
            passed.insert(key);
            Verdict::Allowed
        } else {
            Verdict::Denied
        }
    }

    fn remembered(&self, key: &(String, String, String)) -> bool {
        self.passed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(key)
    }
}

/// A check counted as pending while it lives.
struct Pending<'a> {
    counter: &'a AtomicUsize,
    /// Checks pending, this one included, when it entered.
    count: usize,
}

impl<'a> Pending<'a> {
    fn enter(counter: &'a AtomicUsize) -> Self {
        let count = counter.fetch_add(1, Ordering::Relaxed) + 1;
        Self { counter, count }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The user and password of an `Authorization: Basic ...` header (RFC 7617: the scheme's
/// name in any case, `user:password` in base64, the user without a colon).
fn credentials(header: &[u8]) -> Option<(String, String)> {
    let header = std::str::from_utf8(header).ok()?.trim();
    let (scheme, encoded) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(text: &str) -> Vec<u8> {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(text)
        )
        .into_bytes()
    }

    #[test]
    fn credentials_are_read_as_rfc_7617_writes_them() {
        assert_eq!(
            credentials(&basic("prometheus:pa:ss")),
            Some(("prometheus".to_owned(), "pa:ss".to_owned())),
            "the user ends at the first colon"
        );
        assert_eq!(
            credentials(b"basic cHJvbTo="),
            Some(("prom".to_owned(), String::new()))
        );
        assert_eq!(credentials(b"Bearer abc"), None);
        assert_eq!(credentials(b"Basic !!!"), None);
        assert_eq!(credentials(&basic("no colon")), None);
        assert_eq!(credentials(b"Basic"), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn only_the_right_password_of_a_known_user_passes() {
        // The lowest cost bcrypt takes: these tests check the logic, not the cost.
        let hash = bcrypt::hash("secret", 4).unwrap();
        let users = BTreeMap::from([("prometheus".to_owned(), hash.clone())]);
        let verifier = Verifier::new();
        let check = |header: Vec<u8>| {
            let (verifier, users) = (&verifier, &users);
            async move { verifier.check(users, Some(&header)).await }
        };
        assert_eq!(check(basic("prometheus:secret")).await, Verdict::Allowed);
        assert_eq!(check(basic("prometheus:wrong")).await, Verdict::Denied);
        assert_eq!(check(basic("other:secret")).await, Verdict::Denied);
        assert_eq!(verifier.check(&users, None).await, Verdict::Denied);
        // Remembered with the hash it passed against: a new hash checks it again.
        assert!(verifier.remembered(&("prometheus".to_owned(), hash, "secret".to_owned())));
        let changed = BTreeMap::from([("prometheus".to_owned(), bcrypt::hash("new", 4).unwrap())]);
        assert_eq!(
            verifier
                .check(&changed, Some(&basic("prometheus:secret")))
                .await,
            Verdict::Denied
        );
        // No users: no basic auth.
        assert_eq!(
            verifier.check(&BTreeMap::new(), None).await,
            Verdict::Allowed
        );
    }
}
