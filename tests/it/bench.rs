//! `cotald bench` runs its cases against an appliance of its own (and the throughput cases
//! again on one that syncs every write) and reports every figure beside its baseline (the
//! figures themselves are for reading, not asserted).

use crate::helper::{TIMEOUT, cotald_bin};

#[tokio::test]
async fn bench_reports_each_case_beside_its_baseline() {
    let out = tokio::time::timeout(
        TIMEOUT * 4,
        tokio::process::Command::new(cotald_bin())
            .args([
                "bench", "--quick", "--runs", "1", "--json", "--case", "dm", "--case", "latency",
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the bench finishes")
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
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
            "live_latency_p50",
            "live_latency_p99",
            "dm_throughput",
            "dm_throughput_sync_always"
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
    }
    assert!(report["machine"]["cores"].as_u64().unwrap() >= 1);
}
