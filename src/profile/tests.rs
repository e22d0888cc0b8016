//! The profile's parsing and validation, rule by rule.

use super::*;

#[test]
fn every_shipped_profile_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Profile::read(&path).unwrap();
            count += 1;
        }
    }
    assert!(count >= 1);
    let embedded = Profile::embedded().unwrap();
    assert_eq!(embedded.spaces["main"].profile, DeploymentProfile::Local);
    assert!(embedded.dashboard.enabled);
    assert_eq!(
        embedded.dashboard.listen,
        SocketAddr::from(([127, 0, 0, 1], DASHBOARD_PORT))
    );
    assert_eq!(embedded.spaces["main"].jetstream.max_file_store, 10 << 30);
}

#[test]
fn unknown_key_names_the_key_and_the_file() {
    let text = EMBEDDED_LOCAL.replace("sync_interval", "sync_intervall");
    let err = Profile::parse(&text, "my.toml").unwrap_err().to_string();
    assert!(err.contains("my.toml"), "{err}");
    assert!(err.contains("sync_intervall"), "{err}");
}

#[test]
fn the_monitoring_port_is_off_unless_asked_for() {
    assert_eq!(Profile::embedded().unwrap().broker.monitor, None);
    let asked = EMBEDDED_LOCAL.replace("# monitor = ", "monitor = ");
    let profile = Profile::parse(&asked, "t.toml").unwrap();
    assert_eq!(
        profile.broker.monitor,
        Some("127.0.0.1:8222".parse().unwrap())
    );
}

#[test]
fn refusals() {
    let cases = [
        (
            "# monitor = \"127.0.0.1:8222\"",
            "monitor = \"0.0.0.0:8222\"",
            "loopback",
        ),
        (
            "sync_interval = \"1s\"",
            "sync_interval = \"soon\"",
            "sync_interval",
        ),
        ("spaces.main", "spaces.\"ma.in\"", "space name"),
        (
            "max_file_store = \"10G\"",
            "max_file_store = \"10X\"",
            "invalid size",
        ),
    ];
    for (from, to, expect) in cases {
        let text = EMBEDDED_LOCAL.replace(from, to);
        assert_ne!(text, EMBEDDED_LOCAL, "{from}");
        let err = Profile::parse(&text, "t.toml").unwrap_err().to_string();
        assert!(err.contains(expect), "{to}: {err}");
    }
}

#[test]
fn deployment_profile_decides_the_default_delivery_class() {
    let local = Profile::embedded().unwrap();
    let defaults = local.spaces["main"].channel_defaults();
    assert_eq!(defaults.delivery_class, Some(DeliveryClass::Durable));
    let public =
        Profile::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/public.toml")).unwrap();
    let space = &public.spaces["main"];
    assert_eq!(
        space.channel_defaults().delivery_class,
        Some(DeliveryClass::Live)
    );
    let entries = space.registry_entries();
    assert_eq!(entries[0].0, "=defaults");
    assert_eq!(entries[0].1["deliveryClass"], "live");
    assert_eq!(entries[0].1["replayWindow"], "24h");
    let incidents = entries.iter().find(|(k, _)| k == "incidents").unwrap();
    assert_eq!(incidents.1["deliveryClass"], "durable");
    assert_eq!(space.retention().dm.max_bytes, 4 << 30);
    assert_eq!(space.retention().dm.max_age.as_secs(), 14 * 86400);
}

#[test]
fn channel_configs_are_validated() {
    let bad = [
        (
            "[spaces.main.channels.general]",
            "[spaces.main.channels.\"a.>\"]",
            "concrete",
        ),
        (
            "[spaces.main.channels.general]",
            "[spaces.main.channels.\"foo/bar\"]",
            "concrete",
        ),
        (
            "description = \"Everyone",
            "colour = \"red\"\ndescription = \"Everyone",
            "colour",
        ),
        ("replay = true", "replay_window = \"1w\"", "replay"),
    ];
    for (from, to, expect) in bad {
        let text = EMBEDDED_LOCAL.replace(from, to);
        assert_ne!(text, EMBEDDED_LOCAL, "{from}");
        let err = Profile::parse(&text, "t.toml").unwrap_err().to_string();
        assert!(err.contains(expect), "{to}: {err}");
    }
    let long = format!("description = \"{}\"", "x".repeat(201));
    let text = EMBEDDED_LOCAL.replace(
        "description = \"Everyone's channel: announcements, questions, coordination.\"",
        &long,
    );
    assert!(Profile::parse(&text, "t.toml").is_err());
}

#[test]
fn sizes() {
    assert_eq!(parse_size("512"), Some(512));
    assert_eq!(parse_size("256M"), Some(256 << 20));
    assert_eq!(parse_size("1t"), Some(1 << 40));
    assert_eq!(parse_size("G"), None);
    assert_eq!(parse_size("99999999999T"), None);
}
