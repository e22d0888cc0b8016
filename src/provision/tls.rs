//! The TLS material under `<data-dir>/tls`: a local CA (created once; `ca.pem` is what clients
//! trust) and a server certificate signed by it, issued anew at every start so that its SANs
//! always match the configured names (localhost, 127.0.0.1, ::1 and every `--hostname`), and
//! again while the appliance runs before it ends ([`TlsFiles::renew`]; the profile's
//! `certificate_lifetime`, a year unless set).
//!
//! A configured name is checked before anything is written: `*`, `a/b` or a blank would
//! otherwise be signed into the certificate as a name that no client can match.

use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use super::ProvisionError;
use super::files::read_private;
use crate::files::{private_dir, write_atomic, write_replacing};

const CA_NAME: &str = "cotald local CA";

/// The shortest server certificate lifetime: renewed with a third of it left, it must leave
/// the renewal time to be retried.
pub const MIN_CERTIFICATE_LIFETIME: std::time::Duration = std::time::Duration::from_secs(10);

/// Paths of the TLS files the broker and its clients use.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA certificate clients trust.
    pub ca_cert: PathBuf,
    /// The server certificate (PEM).
    pub server_cert: PathBuf,
    /// The server private key (PEM, 0600).
    pub server_key: PathBuf,
    /// When the server certificate ends.
    pub server_expires: SystemTime,
}

impl TlsFiles {
    /// Loads (or creates) the CA in `dir` and issues a server certificate for `hostnames`
    /// in addition to the loopback names, valid for `lifetime`.
    pub fn ensure(
        dir: &Path,
        hostnames: &[String],
        lifetime: std::time::Duration,
    ) -> Result<Self, ProvisionError> {
        check_request(hostnames, lifetime)?;
        private_dir(dir)?;
        let ca_key = ca_key(dir)?;
        issue_server(dir, ca_key, hostnames, lifetime)
    }

    /// Issues the server certificate in `dir` again, from the CA there (which must exist):
    /// the broker reads it at its next reload.
    pub fn renew(
        dir: &Path,
        hostnames: &[String],
        lifetime: std::time::Duration,
    ) -> Result<Self, ProvisionError> {
        check_request(hostnames, lifetime)?;
        let ca_key = KeyPair::from_pem(&read_private(&dir.join("ca.key"))?)?;
        issue_server(dir, ca_key, hostnames, lifetime)
    }
}

fn check_request(
    hostnames: &[String],
    lifetime: std::time::Duration,
) -> Result<(), ProvisionError> {
    if lifetime < MIN_CERTIFICATE_LIFETIME {
        return Err(ProvisionError::Lifetime(lifetime));
    }
    for host in hostnames {
        validate_hostname(host)?;
    }
    Ok(())
}

/// The CA's key in `dir`, the CA created first when there is none.
fn ca_key(dir: &Path) -> Result<KeyPair, ProvisionError> {
    let ca_cert = dir.join("ca.pem");
    let ca_key_path = dir.join("ca.key");
    match (ca_cert.exists(), ca_key_path.exists()) {
        (true, true) => Ok(KeyPair::from_pem(&read_private(&ca_key_path)?)?),
        (false, false) => {
            let key = KeyPair::generate()?;
            let cert = ca_params()?.self_signed(&key)?;
            write_atomic(&ca_key_path, key.serialize_pem().as_bytes(), 0o600)?;
            write_atomic(&ca_cert, cert.pem().as_bytes(), 0o644)?;
            tracing::info!(path = %ca_cert.display(), "generated the local CA");
            Ok(key)
        }
        (present, _) => {
            let (present, missing) = if present {
                (ca_cert, ca_key_path)
            } else {
                (ca_key_path, ca_cert)
            };
            Err(ProvisionError::HalfPresent {
                dir: dir.to_owned(),
                present,
                missing,
            })
        }
    }
}

/// Issues the server certificate and key into `dir`, signed by the CA's key, valid from an
/// hour ago (clocks drift) for `lifetime`; each file written atomically. The broker reads them
/// when it starts and when it is told to reload.
fn issue_server(
    dir: &Path,
    ca_key: KeyPair,
    hostnames: &[String],
    lifetime: std::time::Duration,
) -> Result<TlsFiles, ProvisionError> {
    // The issuer needs only the CA's name and key: both are fixed, so rebuilding the
    // parameters reproduces the subject the stored CA certificate carries.
    let issuer = Issuer::new(ca_params()?, ca_key);
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name("cotald");
    params.subject_alt_names = server_sans(hostnames)?;
    // Client auth too: the nodes of a cluster present this certificate to each other on
    // their routes, which verify both sides.
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + lifetime;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    // Not synced: issued anew at every start, before the broker reads them, so what a crash
    // leaves of them is never read (two syncs were a millisecond of every start).
    let server_cert = dir.join("server.pem");
    let server_key = dir.join("server.key");
    write_replacing(&server_key, key.serialize_pem().as_bytes(), 0o600)?;
    write_replacing(&server_cert, cert.pem().as_bytes(), 0o644)?;
    Ok(TlsFiles {
        ca_cert: dir.join("ca.pem"),
        server_cert,
        server_key,
        server_expires: SystemTime::from(params.not_after),
    })
}

/// The longest DNS name (RFC 1035), and its longest label.
const MAX_DNS_NAME: usize = 253;
const MAX_LABEL: usize = 63;

/// Refuses a name for the server certificate that is neither an IP address (IPv6 possibly in
/// brackets) nor a DNS name: dot-separated labels of 1 to 63 letters, digits and `-`, not
/// starting or ending with `-`, at most 253 characters, the last label not all digits (a
/// mistyped IPv4 address). Wildcards are refused: the certificate names this server only.
pub fn validate_hostname(host: &str) -> Result<(), ProvisionError> {
    let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let ip = match bracketed {
        Some(inner) => inner.parse::<Ipv6Addr>().is_ok(),
        None => host.parse::<IpAddr>().is_ok(),
    };
    let label = |l: &str| {
        (1..=MAX_LABEL).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let dns = host.len() <= MAX_DNS_NAME
        && host.split('.').all(label)
        && !host
            .rsplit('.')
            .next()
            .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()));
    if ip || dns {
        Ok(())
    } else {
        Err(ProvisionError::Hostname(host.to_owned()))
    }
}

fn ca_params() -> Result<CertificateParams, ProvisionError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name(CA_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(3650);
    Ok(params)
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "cotald");
    dn
}

fn server_sans(hostnames: &[String]) -> Result<Vec<SanType>, ProvisionError> {
    let mut sans = vec![
        SanType::DnsName("localhost".try_into()?),
        SanType::IpAddress(IpAddr::from([127, 0, 0, 1])),
        SanType::IpAddress(IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])),
    ];
    for host in hostnames {
        let san = match host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(host.as_str().try_into()?),
        };
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    Ok(sans)
}

#[cfg(test)]
mod tests {
    use super::*;

    const YEAR: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

    #[test]
    fn a_renewal_keeps_the_ca_and_issues_a_certificate_that_ends_later() {
        let tmp = tempfile::tempdir().unwrap();
        let short = std::time::Duration::from_secs(60);
        let first = TlsFiles::ensure(tmp.path(), &[], short).unwrap();
        let ca = std::fs::read_to_string(&first.ca_cert).unwrap();
        let cert = std::fs::read_to_string(&first.server_cert).unwrap();
        let left = first
            .server_expires
            .duration_since(SystemTime::now())
            .unwrap();
        assert!(
            left <= short && left > short - std::time::Duration::from_secs(5),
            "{left:?}"
        );
        let renewed = TlsFiles::renew(tmp.path(), &[], short).unwrap();
        assert_eq!(ca, std::fs::read_to_string(&renewed.ca_cert).unwrap());
        assert_ne!(cert, std::fs::read_to_string(&renewed.server_cert).unwrap());
        assert!(renewed.server_expires >= first.server_expires);
    }

    #[test]
    fn a_lifetime_too_short_to_renew_is_refused_and_a_renewal_needs_the_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let refused = TlsFiles::ensure(tmp.path(), &[], std::time::Duration::from_secs(9));
        assert!(matches!(refused, Err(ProvisionError::Lifetime(_))));
        assert!(TlsFiles::renew(tmp.path(), &[], YEAR).is_err(), "no CA yet");
    }

    #[test]
    fn ca_is_kept_and_server_cert_reissued() {
        let tmp = tempfile::tempdir().unwrap();
        let first = TlsFiles::ensure(tmp.path(), &[], YEAR).unwrap();
        let ca = std::fs::read_to_string(&first.ca_cert).unwrap();
        let cert = std::fs::read_to_string(&first.server_cert).unwrap();
        let second = TlsFiles::ensure(tmp.path(), &["example.test".into()], YEAR).unwrap();
        assert_eq!(ca, std::fs::read_to_string(&second.ca_cert).unwrap());
        assert_ne!(cert, std::fs::read_to_string(&second.server_cert).unwrap());
    }

    #[test]
    fn half_present_ca_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        TlsFiles::ensure(tmp.path(), &[], YEAR).unwrap();
        std::fs::remove_file(tmp.path().join("ca.key")).unwrap();
        assert!(matches!(
            TlsFiles::ensure(tmp.path(), &[], YEAR),
            Err(ProvisionError::HalfPresent { .. })
        ));
    }

    #[test]
    fn hostnames_are_dns_names_or_ip_addresses() {
        let label = "a".repeat(63);
        let longest = [label.as_str(); 4].join(".")[..253].to_owned();
        for ok in [
            "localhost",
            "box.local",
            "a-b.example.com",
            "xn--bcher-kva.example",
            "10.1.2.3",
            "::1",
            "[fe80::1]",
            "2001:db8::7",
            label.as_str(),
            longest.as_str(),
        ] {
            assert!(validate_hostname(ok).is_ok(), "{ok}");
        }
        let too_long = format!("{longest}a");
        let label_too_long = format!("{label}a.example");
        for bad in [
            "",
            " ",
            "*",
            "*.example.com",
            "a/b",
            "a b",
            "a..b",
            ".example",
            "example.",
            "-box",
            "box-.local",
            "under_score",
            "caf\u{e9}.example",
            "esc\u{1b}",
            "10.1.2.999",
            "[10.1.2.3]",
            "[::1",
            "::1]",
            too_long.as_str(),
            label_too_long.as_str(),
        ] {
            let err = validate_hostname(bad).expect_err(bad).to_string();
            assert!(
                err.contains(&format!("{bad:?}")) && err.contains("IPv4 or IPv6"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_bad_hostname_writes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tls");
        assert!(matches!(
            TlsFiles::ensure(&dir, &["ok.example".into(), "a/b".into()], YEAR),
            Err(ProvisionError::Hostname(h)) if h == "a/b"
        ));
        assert!(!dir.exists());
    }

    #[test]
    fn sans_include_loopback_and_configured_names() {
        let sans = server_sans(&["10.1.2.3".into(), "box.local".into(), "[::1]".into()]).unwrap();
        assert_eq!(sans.len(), 5);
        assert!(sans.contains(&SanType::IpAddress("10.1.2.3".parse().unwrap())));
    }
}
