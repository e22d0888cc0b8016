//! `cotald bench` runs its cases against an appliance of its own (and the throughput cases
//! again on one that syncs every write) and reports every figure beside its baseline (the
//! figures themselves are for reading, not asserted).

use std::time::Duration;

use crate::helper::cotald_bin;

#[tokio::test]
async fn bench_reports_each_case_beside_its_baseline() {
    // Its progress and logs go to a file, so that a bench that does not finish says where.
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = tokio::process::Command::new(cotald_bin())
        .args([
            "bench", "--quick", "--runs", "1", "--json", "-v", "--case", "dm", "--case", "latency",
            "--case", "fanout", "--case", "serial",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(log.reopen().unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The bench bounds each wait (a send, a delivery: 120 s) and says which one stalled; a
    // machine under the rest of the suite is slower, hence the wide bound on the whole.
    let Ok(out) = tokio::time::timeout(Duration::from_secs(600), child.wait_with_output()).await
    else {
        let said = std::fs::read_to_string(log.path()).unwrap_or_default();
        panic!("the bench did not finish; it said:\n{said}");
    };
    let out = out.unwrap();
    assert!(
        out.status.success(),
        "{}",
        std::fs::read_to_string(log.path()).unwrap_or_default()
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let names: Vec<&str> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "live_serial",
            "live_latency_p50",
            "live_latency_p99",
            "default_profile_serial",
            "default_profile_latency_p50",
            "default_profile_latency_p99",
            "latency_split_sender_p50",
            "latency_split_member_p50",
            "dm_throughput",
            "dm_pipelined_100k",
            "durable_fanout_online_1",
            "durable_fanout_online_10",
            "durable_fanout_online_50",
            "dm_throughput_sync_always",
        ]
    );
    for r in report["results"].as_array().unwrap() {
        let (c, b, ratio) = (
            r["cotald"].as_f64().unwrap(),
            r["baseline"].as_f64().unwrap(),
            r["ratio"].as_f64().unwrap(),
        );
        assert!(c > 0.0 && b > 0.0, "{r}");
        assert!(
            (ratio - c / b).abs() < 1e-9,
            "ratio = cotald / baseline: {r}"
        );
        assert!(r["unit"].is_string(), "{r}");
        // One run per side says nothing of where the ratio lies: no interval is claimed.
        assert!(r.get("ratio_interval").is_none(), "{r}");
        if r["name"].as_str().unwrap().ends_with("_serial") {
            // Where each side's CPU went, per message.
            for side in ["appliance", "broker", "clients"] {
                for figure in [
                    format!("{side}_us_per_msg"),
                    format!("{side}_us_per_msg_raw"),
                ] {
                    assert!(
                        r["extra"][&figure].as_f64().is_some_and(|v| v >= 0.0),
                        "{figure}: {r}"
                    );
                }
            }
        }
        if r["name"]
            .as_str()
            .unwrap()
            .starts_with("durable_fanout_online_")
        {
            for figure in [
                "appliance_us_per_msg_per_member",
                "appliance_us_per_msg_per_member_live",
            ] {
                assert!(
                    r["extra"][figure].as_f64().is_some_and(|v| v >= 0.0),
                    "{figure}: {r}"
                );
            }
        }
    }
    assert!(report["machine"]["cores"].as_u64().unwrap() >= 1);
}
