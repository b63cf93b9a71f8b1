//! Output: a grouped human-readable table, or one stable JSON document.
use super::classify::{Finding, Flavor, Report, Runtimes, Status};
use super::facts::{Facts, FeatureFacts, HostFacts, KvmFacts, NetworkFacts};
use serde::Serialize;
use std::fmt::Write as _;

/// Bumped whenever a key is renamed or removed (adding keys does not bump it).
pub const SCHEMA_VERSION: u32 = 1;

/// Table width the detail column is wrapped to.
const WIDTH: usize = 100;

#[derive(Serialize)]
struct JsonDoc<'a> {
    schema_version: u32,
    kvm: JsonKvm<'a>,
    host: &'a HostFacts,
    features: &'a FeatureFacts,
    network: JsonNetwork<'a>,
    runtimes: &'a Runtimes,
    findings: &'a [Finding],
    exit_code: i32,
}

/// The gathered KVM facts plus the derived flavor, as one `kvm` object.
#[derive(Serialize)]
struct JsonKvm<'a> {
    flavor: Flavor,
    #[serde(flatten)]
    facts: &'a KvmFacts,
}

/// The gathered network facts plus the backend they lead to, as one `network` object.
#[derive(Serialize)]
struct JsonNetwork<'a> {
    backend: &'static str,
    #[serde(flatten)]
    facts: &'a NetworkFacts,
}

pub fn json(facts: &Facts, report: &Report) -> String {
    let doc = JsonDoc {
        schema_version: SCHEMA_VERSION,
        kvm: JsonKvm {
            flavor: report.flavor,
            facts: &facts.kvm,
        },
        host: &facts.host,
        features: &facts.features,
        network: JsonNetwork {
            backend: report.network_backend,
            facts: &facts.network,
        },
        runtimes: &report.runtimes,
        findings: &report.findings,
        exit_code: report.exit_code(),
    };
    // Serializing plain structs of strings, numbers and bools cannot fail.
    serde_json::to_string_pretty(&doc).expect("doctor JSON serializes")
}

fn marker(status: Status) -> char {
    match status {
        Status::Ok => '✓',
        Status::Warn => '!',
        Status::Fail => '✗',
    }
}

fn group_title(group: &str) -> &str {
    match group {
        "kvm" => "KVM",
        "host" => "Host",
        "memory" => "Memory",
        "isolation" => "Isolation",
        "storage" => "Storage",
        "treeclone" => "Tree clones",
        "devices" => "Devices",
        "qemu" => "QEMU",
        "network" => "Network",
        "runtime" => "Runtimes",
        other => other,
    }
}

pub fn human(facts: &Facts, report: &Report) -> String {
    let h = &facts.host;
    let user = if h.root { "root" } else { "unprivileged user" };
    let mut s = format!(
        "zygote doctor: Linux {} {}, {} cores, as {user}\n",
        h.kernel_release, h.machine, h.cores
    );
    let split = |f: &Finding| -> (String, String) {
        match f.check.split_once('.') {
            Some((g, n)) => (g.to_owned(), n.to_owned()),
            None => (String::new(), f.check.clone()),
        }
    };
    let name_width = report
        .findings
        .iter()
        .map(|f| split(f).1.chars().count())
        .max()
        .unwrap_or(0);
    // Detail column starts after "  ✓ " and the padded name plus two spaces.
    let indent = 4 + name_width + 2;
    let mut current = None;
    for f in &report.findings {
        let (group, name) = split(f);
        if current.as_deref() != Some(group.as_str()) {
            let _ = write!(s, "\n{}\n", group_title(&group));
            current = Some(group);
        }
        let lines = wrap(&f.detail, WIDTH.saturating_sub(indent).max(30));
        let _ = writeln!(
            s,
            "  {} {name:<name_width$}  {}",
            marker(f.status),
            lines[0]
        );
        for line in &lines[1..] {
            let _ = writeln!(s, "{:indent$}{line}", "");
        }
    }
    let rt = &report.runtimes;
    let yes = |b: bool| if b { "yes" } else { "no" };
    let _ = write!(
        s,
        "\nSummary: kvm runtime {}, probe guests {}, qemu runtime {}{}; default runtime: {}; \
         network: {}\n",
        yes(rt.kvm),
        yes(rt.probe),
        yes(rt.qemu),
        rt.qemu_accel.map(|a| format!(" ({a})")).unwrap_or_default(),
        rt.default_runtime.unwrap_or("none"),
        match report.network_backend {
            "isolated" => "isolated",
            _ => "user (not isolated)",
        },
    );
    s.push_str("Legend: ✓ ok   ! works with limits   ✗ missing or unusable\n");
    s
}

/// Greedy word wrap; a word longer than `width` gets a line of its own.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let line = lines.last_mut().expect("never empty");
        if line.is_empty() {
            line.push_str(word);
        } else if line.chars().count() + 1 + word.chars().count() <= width {
            line.push(' ');
            line.push_str(word);
        } else {
            lines.push(word.to_owned());
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::super::classify::classify;
    use super::*;

    #[test]
    fn wrap_keeps_words_and_width() {
        let text = "a bb ccc dddd eeeee ffffff";
        let lines = wrap(text, 8);
        assert!(lines.iter().all(|l| l.chars().count() <= 8));
        assert_eq!(lines.join(" "), text);
        assert_eq!(wrap("", 10), vec![String::new()]);
        assert_eq!(
            wrap("averyveryverylongword x", 5),
            vec!["averyveryverylongword", "x"]
        );
    }

    #[test]
    fn json_has_documented_keys() {
        let facts = Facts::default();
        let report = classify(&facts);
        let v: serde_json::Value = serde_json::from_str(&json(&facts, &report)).unwrap();
        for key in ["present", "accessible", "api_version", "flavor", "caps"] {
            assert!(v["kvm"].get(key).is_some(), "kvm.{key}");
        }
        for key in [
            "thp",
            "userfaultfd",
            "ksm",
            "cgroup_v2",
            "reflink",
            "treeclone",
            "loop_control",
            "tun",
            "vhost_vsock",
            "vhost_net",
            "qemu",
        ] {
            assert!(v["features"].get(key).is_some(), "features.{key}");
        }
        for key in ["kvm", "probe", "qemu"] {
            assert!(v["runtimes"][key].is_boolean(), "runtimes.{key}");
        }
        assert!(v["runtimes"]["default_runtime"].is_null());
        assert_eq!(v["kvm"]["flavor"], "none");
        assert_eq!(v["exit_code"], 1);
        let first = &v["findings"][0];
        assert_eq!(first["check"], "kvm.device");
        assert_eq!(first["status"], "fail");
        assert!(first["detail"].is_string());
        assert!(v["host"].get("mem_total_kib").is_some());
        assert_eq!(v["network"]["backend"], "user");
        for key in [
            "ip",
            "nft",
            "netns_dir",
            "namespaces",
            "ip_forward",
            "route_clashes",
            "nameservers",
            "dns",
            "host_table",
        ] {
            assert!(v["network"].get(key).is_some(), "network.{key}");
        }
        assert!(v["network"]["nft"].get("version").is_some());
    }

    #[test]
    fn human_groups_and_marks() {
        let facts = Facts::default();
        let out = human(&facts, &classify(&facts));
        assert!(out.contains("\nKVM\n"));
        assert!(out.contains("\nRuntimes\n"));
        assert!(out.contains("  ✗ device"));
        assert!(out.contains("default runtime: none"));
        assert!(out.contains("\nNetwork\n"));
        assert!(out.contains("network: user (not isolated)"));
    }
}
