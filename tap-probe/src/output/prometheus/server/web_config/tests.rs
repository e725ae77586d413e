//! The web config file, read as the exporter toolkit reads it, and refused in one line that
//! names the key wherever it cannot be used.

use super::*;

/// A directory with a self-signed certificate for 127.0.0.1 (`tls.crt`, `tls.key`), the key
/// of another (`other.key`), a CA (`ca.crt`) and the web config file `web.yml` holding
/// `config`.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["ca".to_owned()]).unwrap();
        for (name, text) in [
            ("tls.crt", server.cert.pem()),
            ("tls.key", server.signing_key.serialize_pem()),
            ("other.key", other.serialize_pem()),
            ("ca.crt", ca.cert.pem()),
            ("empty.pem", String::new()),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        Self { dir }
    }

    /// Reads `config` as the web config file; its files as read, or the one-line problem.
    fn read(&self, config: &str) -> Result<WebConfig, String> {
        let path = self.dir.path().join("web.yml");
        std::fs::write(&path, config).unwrap();
        let (files, result) = read(&path);
        assert_eq!(files[0], path, "the config file is the first one looked at");
        result.map_err(|err| {
            let text = err.to_string();
            assert!(!text.contains('\n'), "one line: {text}");
            let prefix = format!("--web.config.file {}: ", path.display());
            text.strip_prefix(&prefix)
                .unwrap_or_else(|| panic!("{text} starts with {prefix}"))
                .to_owned()
        })
    }

    fn refused(&self, config: &str) -> String {
        match self.read(config) {
            Ok(read) => panic!("{config} was taken: {read:?}"),
            Err(problem) => problem,
        }
    }
}

#[test]
fn a_file_with_tls_and_users_is_taken_its_paths_from_its_directory() {
    let files = Files::new();
    let hash = bcrypt::hash("secret", 4).unwrap();
    let config = files
        .read(&format!(
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: {}\n  min_version: TLS13\n\
             basic_auth_users:\n  prometheus: {hash}\n",
            files.dir.path().join("tls.key").display()
        ))
        .unwrap();
    let tls = config.tls.expect("TLS asked for");
    assert_eq!(tls.alpn_protocols, [b"http/1.1".to_vec()]);
    assert_eq!(config.users.get("prometheus"), Some(&hash));
}

#[test]
fn nothing_asked_for_is_plain_http_open_to_all() {
    let files = Files::new();
    for empty in [
        "",
        "# nothing yet\n",
        "tls_server_config:\n",
        "tls_server_config: {}\n",
    ] {
        let config = files.read(empty).unwrap();
        assert!(config.tls.is_none() && config.users.is_empty(), "{empty:?}");
    }
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let files = Files::new();
    let problem = files.refused("tls_server_config:\n  cert_fil: tls.crt\n  key_file: tls.key\n");
    assert!(
        problem.starts_with(
            "tls_server_config: unknown field `cert_fil`, expected one of `cert_file`"
        ),
        "{problem}"
    );
    assert!(problem.contains("line 2"), "{problem}");
    let problem = files.refused("basic_auth_user:\n  prometheus: x\n");
    assert!(
        problem.starts_with("unknown field `basic_auth_user`"),
        "{problem}"
    );
    let problem = files.refused("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  client_auth_type: Always\n");
    assert!(
        problem.starts_with("tls_server_config.client_auth_type: unknown variant `Always`"),
        "{problem}"
    );
    let problem = files.refused("basic_auth_users:\n  a: x\n  a: y\n");
    assert!(
        problem.contains("duplicate entry with key \"a\""),
        "{problem}"
    );
    assert!(files.refused("tls_server_config: [\n").contains("line 2"));
}

#[test]
fn keys_of_the_toolkit_not_taken_here_are_refused_by_name() {
    let files = Files::new();
    for (text, key) in [
        (
            "tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            "tls_server_config.cipher_suites",
        ),
        (
            "tls_server_config:\n  client_allowed_sans: [a]\n",
            "tls_server_config.client_allowed_sans",
        ),
        (
            "tls_server_config:\n  cert: PEM\n",
            "tls_server_config.cert",
        ),
        (
            "http_server_config:\n  http2: false\n",
            "http_server_config",
        ),
        ("rate_limit:\n  burst: 1\n", "rate_limit"),
    ] {
        let problem = files.refused(text);
        assert!(
            problem.starts_with(&format!(
                "{key} is a key of the exporter toolkit's web config that tap-probe does not take"
            )),
            "{problem}"
        );
    }
}

#[test]
fn a_key_that_is_not_its_certificates_is_refused() {
    let files = Files::new();
    let problem =
        files.refused("tls_server_config:\n  cert_file: tls.crt\n  key_file: other.key\n");
    let dir = files.dir.path().display();
    assert_eq!(
        problem,
        format!(
            "tls_server_config.key_file {dir}/other.key is not the key of the certificate in \
             cert_file {dir}/tls.crt"
        )
    );
}

#[test]
fn missing_or_empty_certificate_and_key_files_are_named() {
    let files = Files::new();
    let dir = files.dir.path().display();
    let problem = files.refused("tls_server_config:\n  key_file: tls.key\n");
    assert!(
        problem.starts_with("tls_server_config.cert_file is missing"),
        "{problem}"
    );
    let problem = files.refused("tls_server_config:\n  cert_file: tls.crt\n");
    assert!(
        problem.starts_with("tls_server_config.key_file is missing"),
        "{problem}"
    );
    let problem =
        files.refused("tls_server_config:\n  cert_file: nowhere.crt\n  key_file: tls.key\n");
    assert!(
        problem.starts_with(&format!("tls_server_config.cert_file {dir}/nowhere.crt: ")),
        "{problem}"
    );
    let problem =
        files.refused("tls_server_config:\n  cert_file: empty.pem\n  key_file: tls.key\n");
    assert!(
        problem.contains("empty.pem: no certificate in it"),
        "{problem}"
    );
    let problem = files.refused("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.crt\n");
    assert!(
        problem.starts_with(&format!(
            "tls_server_config.key_file {dir}/tls.crt: no private key"
        )),
        "{problem}"
    );
}

#[test]
fn client_certificates_are_verified_against_a_ca_or_not_asked_for() {
    let files = Files::new();
    let tls = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n";
    for auth in ["RequireAndVerifyClientCert", "VerifyClientCertIfGiven"] {
        files
            .read(&format!(
                "{tls}  client_auth_type: {auth}\n  client_ca_file: ca.crt\n"
            ))
            .unwrap();
        let problem = files.refused(&format!("{tls}  client_auth_type: {auth}\n"));
        assert!(
            problem.starts_with(&format!(
                "tls_server_config.client_auth_type {auth} needs client_ca_file"
            )),
            "{problem}"
        );
    }
    let problem = files.refused(&format!("{tls}  client_ca_file: ca.crt\n"));
    assert!(
        problem.starts_with(
            "tls_server_config.client_ca_file is set, but client_auth_type is NoClientCert"
        ),
        "{problem}"
    );
    for unverified in [
        "RequestClientCert",
        "RequireAnyClientCert",
        "RequireClientCert",
    ] {
        let problem = files.refused(&format!(
            "{tls}  client_auth_type: {unverified}\n  client_ca_file: ca.crt\n"
        ));
        assert!(
            problem.contains("lets in certificates nobody verified"),
            "{problem}"
        );
    }
    let problem = files.refused(&format!(
        "{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: empty.pem\n"
    ));
    assert!(
        problem.starts_with("tls_server_config.client_ca_file"),
        "{problem}"
    );
}

#[test]
fn tls_versions_are_those_rustls_speaks() {
    let files = Files::new();
    let tls = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n";
    files
        .read(&format!(
            "{tls}  min_version: TLS12\n  max_version: TLS12\n"
        ))
        .unwrap();
    let problem = files.refused(&format!("{tls}  min_version: TLS10\n"));
    assert_eq!(
        problem,
        "tls_server_config.min_version TLS10: tap-probe speaks TLS 1.2 and 1.3 only (TLS12, TLS13)"
    );
    let problem = files.refused(&format!(
        "{tls}  min_version: TLS13\n  max_version: TLS12\n"
    ));
    assert_eq!(
        problem,
        "tls_server_config.min_version TLS13 is above max_version TLS12"
    );
    assert_eq!(
        versions(None, None).unwrap().len(),
        2,
        "TLS 1.2 and 1.3 by default, as the toolkit's"
    );
}

#[test]
fn a_password_hash_that_is_not_bcrypt_is_refused_by_user() {
    let files = Files::new();
    let problem = files.refused("basic_auth_users:\n  prometheus: secret\n");
    assert!(
        problem.starts_with("basic_auth_users.prometheus: not a bcrypt hash ("),
        "{problem}"
    );
    assert!(
        problem.ends_with("make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"),
        "{problem}"
    );
    // A well-formed hash whose cost bcrypt refuses.
    let hash = bcrypt::hash("secret", 4).unwrap();
    let problem = files.refused(&format!(
        "basic_auth_users:\n  prometheus: {}\n",
        hash.replacen("$04$", "$99$", 1)
    ));
    assert!(
        problem.contains("cost 99, where bcrypt takes 4 to 31"),
        "{problem}"
    );
    files
        .read(&format!("basic_auth_users:\n  prometheus: {hash}\n"))
        .unwrap();
}

#[test]
fn an_unreadable_file_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.yml");
    let (files, result) = read(&path);
    assert_eq!(files, std::slice::from_ref(&path));
    assert_eq!(
        result.unwrap_err().to_string(),
        format!(
            "--web.config.file {}: cannot read it: No such file or directory (os error 2)",
            path.display()
        )
    );
}
