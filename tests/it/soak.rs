//! `cotald soak` in CI: two minutes of a ten-agent team's traffic with every kind of churn and
//! fault at least once, judged whole by the soak itself (it exits non-zero on a loss, a false
//! green, a read-again, too many duplicates, a delivery across a leave or a revocation, or a
//! fault not carried out); this test reads its JSON report to say which. And a shorter soak of
//! an appliance that was already running (`--link`).

use std::time::Duration;

use crate::helper::{Cotald, cotald_bin, cotald_in};

/// The run, the settling of what is owed (at most 2 minutes), startup and teardown.
const BOUND: Duration = Duration::from_secs(600);

/// Runs `cotald soak ARGS --json`; its report, and the progress it wrote, for messages.
async fn soak(args: &[&str]) -> (std::process::Output, serde_json::Value, String) {
    let out = tokio::time::timeout(
        BOUND,
        tokio::process::Command::new(cotald_bin())
            .arg("soak")
            .args(args)
            .arg("--json")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the soak ends within its bound")
    .expect("cotald soak runs");
    let progress = String::from_utf8_lossy(&out.stderr).into_owned();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("a JSON report ({e}); stderr:\n{progress}"));
    (out, report, progress)
}

#[tokio::test]
async fn a_two_minute_soak_with_every_fault_loses_nothing_and_reports_truly() {
    let (out, report, progress) = soak(&[
        "--agents",
        "10",
        "--duration",
        "2m",
        "--rate",
        "7200/h",
        "--seed",
        "7",
    ])
    .await;
    let said = || format!("{report:#}\nstderr:\n{progress}");
    assert_eq!(report["delivery"]["lost"], 0, "{}", said());
    assert_eq!(report["health"]["false_green"], 0, "{}", said());
    assert_eq!(report["delivery"]["reread"], 0, "{}", said());
    assert_eq!(report["delivery"]["across_leave"], 0, "{}", said());
    assert_eq!(report["delivery"]["after_revoke"], 0, "{}", said());
    let owed = report["delivery"]["owed"].as_u64().unwrap_or(0);
    assert!(
        report["delivery"]["duplicates"].as_u64() <= Some(owed / 100),
        "duplicates within 1 % of what is owed: {}",
        said()
    );
    assert!(
        report["delivery"]["owed"].as_u64() > Some(100),
        "{}",
        said()
    );
    for fault in [
        "leave and return",
        "host restart",
        "mint",
        "re-issue",
        "revoke",
        "channel config",
        "services cut",
        "broker kill -9",
        "broker stall",
        "appliance restart",
    ] {
        assert!(
            report["faults"][fault].as_u64() >= Some(1),
            "{fault}: {}",
            said()
        );
    }
    assert!(
        report["certificate_renewals"].as_u64() >= Some(1),
        "{}",
        said()
    );
    assert_eq!(report["failures"], serde_json::json!([]), "{}", said());
    assert!(out.status.success(), "{}", said());
}

#[tokio::test]
async fn a_linked_appliance_is_soaked_in_a_space_of_its_own_and_its_team_revoked_after() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let dir = tmp.path().to_str().unwrap();
    let (out, report, progress) = soak(&[
        "--link",
        dir,
        "--agents",
        "5",
        "--duration",
        "45s",
        "--rate",
        "3600/h",
        "--seed",
        "5",
    ])
    .await;
    let said = || format!("{report:#}\nstderr:\n{progress}");
    assert!(out.status.success(), "{}", said());
    assert_eq!(report["linked"], dir, "{}", said());
    assert_eq!(report["delivery"]["lost"], 0, "{}", said());
    assert!(report["delivery"]["owed"].as_u64() > Some(10), "{}", said());
    assert!(
        report["faults"]["appliance restart"].is_null(),
        "a linked appliance is not restarted: {}",
        said()
    );
    // The appliance that was there still runs, with the soak's space beside its own.
    let spaces = cotald_in(tmp.path(), &["space", "list", "--json"]).await;
    let spaces = String::from_utf8_lossy(&spaces.stdout);
    assert!(
        spaces.contains("soak-5") && spaces.contains("main"),
        "{spaces}"
    );
    // No credential the soak minted still reaches it.
    let listed = cotald_in(tmp.path(), &["identities", "--json", "--space", "soak-5"]).await;
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let rows = listed.as_array().unwrap();
    assert!(rows.len() >= 7, "five agents and two canaries: {listed:#}");
    assert!(
        rows.iter().all(|r| r["revokedAt"].is_string()),
        "every identity revoked: {listed:#}"
    );
    c.stop().await;
}
