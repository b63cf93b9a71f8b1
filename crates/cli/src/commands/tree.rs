//! `zygote tree ID`: draw a sandbox's lineage with what each branch costs;
//! `zygote keep ID [--promote]`: keep one branch, drop its siblings;
//! `zygote diff A B [PATH]`: how A's files differ from B's.
use std::collections::BTreeMap;

use zygote_api::client::{block_on, Method};
use zygote_api::model::{KeepRequest, KeepResponse, SandboxDiff, SandboxTree, TreeNode};

use super::daemon_client::{print_json, ApiArgs};

#[derive(clap::Args)]
pub struct TreeArgs {
    /// Any sandbox of the tree.
    id: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

#[derive(clap::Args)]
pub struct KeepArgs {
    /// The branch child to keep; its siblings and their descendants are deleted.
    id: String,
    /// Also delete its parent and give it the parent's name.
    #[arg(long)]
    promote: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

#[derive(clap::Args)]
pub struct DiffArgs {
    /// The sandbox whose changes are shown.
    id: String,
    /// The sandbox compared against (a sibling, the parent, ...).
    against: String,
    /// Directory compared in both guests.
    #[arg(default_value = "/root")]
    path: String,
    /// Print the unified diff of each modified text file (up to 256 KiB).
    #[arg(long, short = 'p')]
    patch: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run_diff(args: DiffArgs) -> anyhow::Result<i32> {
    let query = format!(
        "against={}&path={}&content={}",
        args.against,
        percent_encode(&args.path),
        args.patch
    );
    let d: SandboxDiff = block_on(args.api.client()?.json(
        Method::GET,
        &format!("/v1/sandboxes/{}/diff?{query}", args.id),
        None::<&()>,
    ))?;
    if args.json {
        print_json(&d)?;
        return Ok(0);
    }
    for e in &d.added {
        println!("A {}", e.path);
    }
    for e in &d.removed {
        println!("D {}", e.path);
    }
    for m in &d.modified {
        println!("M {}", m.path);
    }
    for m in d.modified.iter().filter_map(|m| m.unified.as_deref()) {
        print!("{m}");
    }
    // Like diff(1): 1 when the trees differ.
    let same = d.added.is_empty() && d.removed.is_empty() && d.modified.is_empty();
    Ok(if same { 0 } else { 1 })
}

/// A guest path as a query value: every byte but unreserved ones and '/' escaped.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn run_tree(args: TreeArgs) -> anyhow::Result<i32> {
    let tree: SandboxTree = block_on(args.api.client()?.json(
        Method::GET,
        &format!("/v1/sandboxes/{}/tree", args.id),
        None::<&()>,
    ))?;
    if args.json {
        print_json(&tree)?;
    } else {
        print!("{}", draw(&tree));
    }
    Ok(0)
}

pub fn run_keep(args: KeepArgs) -> anyhow::Result<i32> {
    let kept: KeepResponse = block_on(args.api.client()?.json(
        Method::POST,
        &format!("/v1/sandboxes/{}/keep", args.id),
        Some(&KeepRequest {
            promote: args.promote,
        }),
    ))?;
    if args.json {
        print_json(&kept)?;
        return Ok(0);
    }
    for id in &kept.deleted {
        println!("deleted {id}");
    }
    match &kept.name {
        Some(n) => println!("kept {} (now named {n})", kept.kept),
        None => println!("kept {}", kept.kept),
    }
    Ok(0)
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "-".into(),
        |b| format!("{:.1} MiB", b as f64 / 1048576.0),
    )
}

fn label(n: &TreeNode) -> String {
    let name = n
        .name
        .as_deref()
        .map(|s| format!(" ({s})"))
        .unwrap_or_default();
    format!(
        "{}{name}  {}  mem {}  disk {}",
        n.id,
        n.state,
        mib(n.unique_memory_bytes),
        mib(n.disk_bytes)
    )
}

/// The tree as `tree(1)` draws directories: one line per sandbox, children indented
/// under their parent, each with its state and own memory and disk.
fn draw(tree: &SandboxTree) -> String {
    let nodes: BTreeMap<&str, &TreeNode> =
        tree.sandboxes.iter().map(|n| (n.id.as_str(), n)).collect();
    let mut out = String::new();
    fn walk(
        out: &mut String,
        nodes: &BTreeMap<&str, &TreeNode>,
        id: &str,
        prefix: &str,
        last: bool,
        top: bool,
    ) {
        let Some(n) = nodes.get(id) else { return };
        let (branch, more) = match (top, last) {
            (true, _) => ("", ""),
            (false, true) => ("└── ", "    "),
            (false, false) => ("├── ", "│   "),
        };
        out.push_str(&format!("{prefix}{branch}{}\n", label(n)));
        let child_prefix = format!("{prefix}{more}");
        for (i, c) in n.children.iter().enumerate() {
            walk(
                out,
                nodes,
                c,
                &child_prefix,
                i + 1 == n.children.len(),
                false,
            );
        }
    }
    walk(&mut out, &nodes, &tree.root, "", true, true);
    if !tree.snapshots.is_empty() {
        out.push_str(&format!(
            "{} snapshot(s) and branch point(s):\n",
            tree.snapshots.len()
        ));
        for s in &tree.snapshots {
            out.push_str(&format!(
                "  {}  {:?} of {}  {}\n",
                s.id,
                s.kind,
                s.source_sandbox,
                mib(Some(s.size_bytes))
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, parent: Option<&str>, children: &[&str]) -> TreeNode {
        TreeNode {
            id: id.into(),
            name: None,
            state: "running".into(),
            parent: parent.map(Into::into),
            started_from: None,
            children: children.iter().map(|c| c.to_string()).collect(),
            unique_memory_bytes: Some(1 << 20),
            disk_bytes: None,
        }
    }

    #[test]
    fn guest_paths_are_escaped_for_the_query() {
        assert_eq!(percent_encode("/root/a b&c=d"), "/root/a%20b%26c%3Dd");
        assert_eq!(percent_encode("/srv/x-y_z.~"), "/srv/x-y_z.~");
    }

    #[test]
    fn draws_children_under_their_parent() {
        let tree = SandboxTree {
            root: "a".into(),
            sandboxes: vec![
                node("a", None, &["b", "c"]),
                node("b", Some("a"), &["d"]),
                node("c", Some("a"), &[]),
                node("d", Some("b"), &[]),
            ],
            snapshots: vec![],
        };
        let lines: Vec<String> = draw(&tree)
            .lines()
            .map(|l| l.split("  running").next().unwrap().to_string())
            .collect();
        assert_eq!(lines, ["a", "├── b", "│   └── d", "└── c"]);
        assert!(draw(&tree).contains("mem 1.0 MiB  disk -"));
    }
}
