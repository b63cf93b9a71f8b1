//! `zygote stats ID [--json]` (docker's name): a sandbox's latest metrics sample and a
//! short history, from the daemon's sampler (`GET /v1/sandboxes/{id}/metrics`).
use zygote_api::client::{block_on, Method};
use zygote_api::model::{MetricSample, MetricsList};

use super::daemon_client::{print_json, ApiArgs};
use super::image::human_bytes;

#[derive(clap::Args)]
pub struct StatsArgs {
    /// Sandbox id.
    id: String,
    /// Samples of history shown under the latest one.
    #[arg(long, default_value_t = 10, value_name = "N")]
    history: usize,
    /// Print the API's JSON (every sample the daemon keeps) instead.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: StatsArgs) -> anyhow::Result<i32> {
    let list: MetricsList = block_on(args.api.client()?.json(
        Method::GET,
        &format!("/v1/sandboxes/{}/metrics", args.id),
        None::<&()>,
    ))?;
    if args.json {
        print_json(&list)?;
    } else {
        print!("{}", render(&args.id, &list.metrics, args.history));
    }
    Ok(0)
}

fn render(id: &str, samples: &[MetricSample], history: usize) -> String {
    let Some(last) = samples.last() else {
        return format!(
            "{id}: no samples yet (running sandboxes are sampled every few seconds; \
             none while paused, and the history starts again when the daemon restarts)\n"
        );
    };
    let cpus = if last.cpu_count == 1 { "CPU" } else { "CPUs" };
    let mut out = format!(
        "{id} at {}\n\
         CPU     {:.1}% of {} {cpus}\n\
         Memory  {} used of {} (cache {})\n\
         Disk    {} used of {}\n",
        last.timestamp,
        last.cpu_used_pct,
        last.cpu_count,
        human_bytes(last.mem_used),
        human_bytes(last.mem_total),
        human_bytes(last.mem_cache),
        human_bytes(last.disk_used),
        human_bytes(last.disk_total),
    );
    let shown = &samples[samples.len().saturating_sub(history)..];
    if shown.len() > 1 {
        out.push_str(&format!(
            "\n{:<22} {:>6}  {:>10}  {:>10}\n",
            "TIME", "CPU%", "MEM USED", "DISK USED"
        ));
        for s in shown {
            out.push_str(&format!(
                "{:<22} {:>6.1}  {:>10}  {:>10}\n",
                s.timestamp,
                s.cpu_used_pct,
                human_bytes(s.mem_used),
                human_bytes(s.disk_used)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: u64, cpu: f64) -> MetricSample {
        MetricSample {
            timestamp: format!("2026-01-01T00:00:{t:02}Z"),
            timestamp_unix: t,
            cpu_count: 2,
            cpu_used_pct: cpu,
            mem_total: 512 << 20,
            mem_used: 100 << 20,
            mem_cache: 10 << 20,
            disk_total: 1 << 30,
            disk_used: 300 << 20,
        }
    }

    #[test]
    fn the_latest_sample_then_the_history() {
        let all: Vec<_> = (0..5).map(|t| sample(t, t as f64 * 10.0)).collect();
        let text = render("sb-1", &all, 3);
        assert!(text.starts_with("sb-1 at 2026-01-01T00:00:04Z\n"), "{text}");
        assert!(text.contains("CPU     40.0% of 2 CPUs"), "{text}");
        assert!(text.contains("Memory  100.0 MiB used of 512.0 MiB (cache 10.0 MiB)"));
        assert!(text.contains("Disk    300.0 MiB used of 1.0 GiB"));
        // Three rows of history, the oldest two left out.
        assert_eq!(text.matches("2026-01-01T00:00:0").count(), 4, "{text}");
        assert!(!text.contains("00:00:01Z"));
        assert!(render("sb-1", &[], 3).contains("no samples yet"));
    }
}
