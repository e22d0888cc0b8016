//! `cotald soak` in CI: two minutes of a ten-agent team's traffic with every kind of churn and
//! fault at least once, judged whole by the soak itself (it exits non-zero on a loss, a false
//! green, a read-again, a delivery across a leave or a revocation, or a fault not carried out);
//! this test reads its JSON report to say which.

use std::time::Duration;

use crate::helper::cotald_bin;

/// The run, the settling of what is owed (at most 2 minutes), startup and teardown.
const BOUND: Duration = Duration::from_secs(600);

#[tokio::test]
async fn a_two_minute_soak_with_every_fault_loses_nothing_and_reports_truly() {
    let out = tokio::time::timeout(
        BOUND,
        tokio::process::Command::new(cotald_bin())
            .args([
                "soak",
                "--agents",
                "10",
                "--duration",
                "2m",
                "--rate",
                "7200/h",
            ])
            .args(["--seed", "7", "--json"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the soak ends within its bound")
    .expect("cotald soak runs");
    let progress = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("a JSON report ({e}); stderr:\n{progress}"));
    let said = || format!("{report:#}\nstderr:\n{progress}");
    assert_eq!(report["delivery"]["lost"], 0, "{}", said());
    assert_eq!(report["health"]["false_green"], 0, "{}", said());
    assert_eq!(report["delivery"]["reread"], 0, "{}", said());
    assert_eq!(report["delivery"]["across_leave"], 0, "{}", said());
    assert_eq!(report["delivery"]["after_revoke"], 0, "{}", said());
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
