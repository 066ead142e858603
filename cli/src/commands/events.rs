//! `kata-topo events`: follows kata-topo's events (`/kata-topo/*`) from containerd's event
//! service, each as readable lines or one JSON line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use kata_topo_core::text::printable;

use crate::out;

/// How long containerd has to answer before `events` gives up on it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Args)]
pub(crate) struct EventsArgs {
    /// containerd's gRPC socket.
    #[arg(
        long,
        value_name = "SOCK",
        default_value = "/run/containerd/containerd.sock"
    )]
    address: PathBuf,
    /// Only this containerd namespace (CRI pods are in k8s.io).
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    /// Print each verdict as one JSON line.
    #[arg(long)]
    json: bool,
}

pub(crate) fn events(args: &EventsArgs) -> Result<ExitCode> {
    use containerd_client::services::v1::events_client::EventsClient;
    use containerd_client::services::v1::version_client::VersionClient;
    use containerd_client::services::v1::SubscribeRequest;
    use prost::Message;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the event loop")?;
    rt.block_on(async {
        // A socket that accepts and never answers (a hung containerd, or something else
        // entirely) would hold the subscription for ever, and containerd answers it only with
        // the first event: containerd must first answer `Version`, within the timeout.
        let answered = tokio::time::timeout(ANSWER_TIMEOUT, async {
            let channel = containerd_client::connect(&args.address)
                .await
                .with_context(|| {
                    format!("cannot connect to containerd at {}", args.address.display())
                })?;
            VersionClient::new(channel.clone())
                .version(())
                .await
                .with_context(|| {
                    format!(
                        "{} does not answer as containerd does",
                        args.address.display()
                    )
                })?;
            anyhow::Ok(channel)
        })
        .await;
        let channel = match answered {
            Ok(channel) => channel?,
            Err(_) => anyhow::bail!(
                "{} did not answer within {} s: is containerd hung, or is this not containerd's socket?",
                args.address.display(),
                ANSWER_TIMEOUT.as_secs()
            ),
        };
        let mut filter = r#"topic~="^/kata-topo/""#.to_string();
        if let Some(ns) = &args.namespace {
            filter.push_str(&format!(",namespace=={ns}"));
        }
        let mut stream = EventsClient::new(channel)
            .subscribe(SubscribeRequest {
                filters: vec![filter],
            })
            .await
            .with_context(|| format!("cannot subscribe to events at {}", args.address.display()))?
            .into_inner();
        while let Some(envelope) = stream
            .message()
            .await
            .context("the event stream from containerd broke")?
        {
            let payload = envelope
                .event
                .as_ref()
                // A google.protobuf.StringValue is prost's `String` message.
                .and_then(|any| String::decode(any.value.as_slice()).ok())
                .unwrap_or_default();
            if args.json {
                out::json(&event_json(&envelope.namespace, &envelope.topic, &payload))?;
            } else {
                out::lines(&event_human(&envelope.namespace, &envelope.topic, &payload))?;
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// An event for `events --json`: a verdict as one compact line (whatever white space its
/// publisher used), anything else wrapped with its topic and namespace.
fn event_json(namespace: &str, topic: &str, payload: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(payload) {
        Ok(v) if serde_json::from_value::<kata_topo_core::Verdict>(v.clone()).is_ok() => {
            v.to_string()
        }
        _ => serde_json::json!({"topic": topic, "namespace": namespace, "payload": payload})
            .to_string(),
    }
}

/// An event for people: the namespace, the topic and the verdict's lines (indented), every
/// value escaped.
fn event_human(namespace: &str, topic: &str, payload: &str) -> String {
    let body = match serde_json::from_str::<kata_topo_core::Verdict>(payload) {
        Ok(v) => v.human().trim_end().replace('\n', "\n    "),
        Err(_) => printable(payload).into_owned(),
    };
    format!("{} {} {body}\n", printable(namespace), printable(topic))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str = "p\u{1b}]0;owned\u{7}\nerror forged-rule: \u{202e}fine";

    fn verdict_payload(pretty: bool) -> String {
        let v = serde_json::json!({
            "operation": "update", "class": "cpuset", "sandbox_id": "sb", "container_id": "c",
            "container_name": "app", "pod": {"name": HOSTILE, "namespace": "ml", "uid": null},
            "policy": "restricted", "mode": "audit", "decision": "allow",
            "findings": [{"rule": "vfio-remote", "severity": "error",
                          "message": format!("remote\r\n{HOSTILE}"),
                          "expected": {}, "observed": {}}]
        });
        if pretty {
            serde_json::to_string_pretty(&v).expect("json")
        } else {
            v.to_string()
        }
    }

    fn has_control(text: &str) -> bool {
        text.chars()
            .any(|c| c != '\n' && kata_topo_core::text::needs_escape(c))
    }

    #[test]
    fn human_events_show_a_verdict_escaped() {
        let text = event_human(
            "k8s.io\u{1b}[1m",
            "/kata-topo/mismatch",
            &verdict_payload(false),
        );
        assert!(!has_control(&text), "{text:?}");
        // The header line and one finding line, nothing forged in between.
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.starts_with("k8s.io\\u{1b}[1m /kata-topo/mismatch update (cpuset): "));
        assert!(text.contains("pod=ml/p\\u{1b}]0;owned\\u{7}\\nerror forged-rule"));
        assert!(
            text.contains("\n      error vfio-remote: remote\\r\\np"),
            "{text}"
        );
        // Not a verdict: the payload itself, escaped.
        let text = event_human("ns", "/kata-topo/other", HOSTILE);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!has_control(&text), "{text:?}");
    }

    #[test]
    fn json_events_are_one_line_each_and_keep_the_values() {
        for pretty in [false, true] {
            let line = event_json("ns", "/kata-topo/mismatch", &verdict_payload(pretty));
            assert!(!line.contains('\n'), "{line}");
            let back: serde_json::Value = serde_json::from_str(&line).expect("json");
            assert_eq!(back["pod"]["name"], HOSTILE);
            assert_eq!(back["findings"][0]["rule"], "vfio-remote");
        }
        let line = event_json("ns", "/kata-topo/other", HOSTILE);
        assert!(!line.contains('\n') && !line.contains('\u{1b}'), "{line}");
        let back: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(back["payload"], HOSTILE);
        assert_eq!(back["topic"], "/kata-topo/other");
    }
}
