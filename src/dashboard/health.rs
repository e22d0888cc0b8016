//! The health page: the verdict first (what keeps delivery from progressing, as `cotald status`
//! says it), then the broker as it reports itself over the system account (`VARZ`, `JSZ`), then
//! the appliance's services as the runtime state records them. What the broker answers is
//! shown as text like everything else (`maud` escapes it).

use maud::{Markup, html};

use super::pages::thead;
use crate::datadir::RuntimeState;
use crate::services::Health;

/// The health page: the verdict, then the broker as it reports itself (`VARZ`, `JSZ`), then
/// the appliance's services as the runtime state records them.
pub(super) fn page(
    state: &RuntimeState,
    varz: Option<&serde_json::Value>,
    jsz: Option<&serde_json::Value>,
) -> Markup {
    html! {
        (verdict(state, varz.is_some()))
        (broker(state, varz))
        (streams(jsz))
        (services(state))
    }
}

/// The verdict first, as `cotald status` gives it: what keeps delivery from progressing.
fn verdict(state: &RuntimeState, broker_answered: bool) -> Markup {
    let mut degraded = crate::ops::status::services_degraded(&state.services);
    if !broker_answered {
        degraded.insert(0, "broker: it did not answer".to_owned());
    }
    html! {
        @if degraded.is_empty() {
            p class="verdict" {
                span class="health-running" { "healthy" }
                ": the broker answers and every service runs"
            }
        } @else {
            div class="verdict warn" {
                span class="health-degraded" { "DEGRADED" }
                ul { @for why in &degraded { li { (why) } } }
            }
        }
    }
}

/// A figure of the broker's answer `v`: `key`'s value as text, `?` when there is none.
fn figure(v: Option<&serde_json::Value>, key: &str) -> String {
    v.and_then(|v| v.get(key))
        .map(|x| match x {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| "?".into())
}

/// The broker as `VARZ` describes it, with what the runtime state knows of its process.
fn broker(state: &RuntimeState, varz: Option<&serde_json::Value>) -> Markup {
    let memory = varz
        .and_then(|v| v["mem"].as_u64())
        .map_or_else(|| "?".to_owned(), crate::profile::human_size);
    let rows = [
        ("nats-server", figure(varz, "version")),
        (
            "pid",
            format!("{} (restarts {})", state.broker_pid, state.broker_restarts),
        ),
        ("uptime", figure(varz, "uptime")),
        (
            "connections",
            format!(
                "{} (total {})",
                figure(varz, "connections"),
                figure(varz, "total_connections")
            ),
        ),
        ("memory", memory),
        ("slow consumers", figure(varz, "slow_consumers")),
        ("client listener", state.listen.to_string()),
    ];
    html! {
        h2 { "Broker" }
        table class="kv" { tbody { @for (name, value) in &rows { tr { th { (name) } td { (value) } } } } }
        @if varz.is_none() { p class="warn" { "The broker did not answer." } }
    }
}

/// Every stream of every account, as `JSZ` describes it.
fn streams(jsz: Option<&serde_json::Value>) -> Markup {
    let streams: Vec<&serde_json::Value> = jsz
        .and_then(|j| j.get("account_details"))
        .and_then(|a| a.as_array())
        .into_iter()
        .flatten()
        .filter_map(|account| account.get("stream_detail").and_then(|s| s.as_array()))
        .flatten()
        .collect();
    html! {
        h2 { "Streams" }
        table {
            (thead(&["stream", "messages", "bytes", "consumers"]))
            tbody {
                @for stream in streams {
                    @let state = stream.get("state");
                    tr class="stream" {
                        td { (figure(Some(stream), "name")) }
                        td { (figure(state, "messages")) }
                        td { (figure(state, "bytes")) }
                        td { (figure(state, "consumer_count")) }
                    }
                }
            }
        }
    }
}

/// The appliance's services and the spaces it could not serve.
fn services(state: &RuntimeState) -> Markup {
    html! {
        h2 { "Services" }
        table {
            (thead(&["scope", "service", "health", "restarts"]))
            tbody {
                @for s in &state.services {
                    @let (word, reason) = match &s.health {
                        Health::Running => ("running", ""),
                        Health::Starting => ("starting", ""),
                        Health::Stopped => ("stopped", ""),
                        Health::Degraded(why) => ("degraded", why.as_str()),
                    };
                    tr class="service" {
                        td { (s.scope) }
                        td { (s.name) }
                        td { span class={ "health-" (word) } { (word) } " " (reason) }
                        td { (s.restarts) }
                    }
                }
                @for u in &state.unserved {
                    tr class="service" {
                        td { (u.name) }
                        td { "(space)" }
                        td { span class="health-degraded" { "not served" } " " (u.reason) }
                        td {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::status::ServiceStatus;

    #[test]
    fn the_verdict_names_what_is_degraded_and_every_figure_is_text() {
        let hostile = "<script>alert(1)</script>";
        let mut state: RuntimeState = serde_json::from_value(serde_json::json!({
            "pid": 1, "broker_pid": 2, "broker_version": "2.12.0",
            "listen": "127.0.0.1:4222", "spaces": ["main"], "broker_restarts": 0,
        }))
        .unwrap();
        state.services.push(ServiceStatus {
            scope: "main".into(),
            name: "warden".into(),
            health: Health::Degraded(hostile.into()),
            restarts: 3,
            last_failure: None,
        });
        let jsz = serde_json::json!({"account_details": [{"stream_detail": [
            {"name": hostile, "state": {"messages": 5, "bytes": 10, "consumer_count": 1}}
        ]}]});
        let html = page(&state, None, Some(&jsz)).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains(r#"<span class="health-degraded">DEGRADED</span>"#),
            "{html}"
        );
        assert!(
            html.contains("<li>broker: it did not answer</li>"),
            "{html}"
        );
        assert!(
            html.contains(r#"<p class="warn">The broker did not answer.</p>"#),
            "{html}"
        );
        assert!(
            html.contains(
                r#"<tr class="stream"><td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td>5</td>"#
            ),
            "{html}"
        );
        assert!(
            html.contains(
                r#"<td>warden</td><td><span class="health-degraded">degraded</span> &lt;script&gt;"#
            ),
            "{html}"
        );
        assert!(
            html.contains("<th>pid</th><td>2 (restarts 0)</td>"),
            "{html}"
        );
    }
}
