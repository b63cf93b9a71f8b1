//! Facts about the generated OpenAPI document that clients and the conformance run
//! (scripts/api-conformance.sh) rely on, checked on its JSON form (what
//! `GET /v1/openapi.json` serves).
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use utoipa::OpenApi;

use super::ApiDoc;
use crate::api::PUBLIC;
use crate::model::{
    BranchRequest, CodeRequest, CreateSandboxRequest, ExecRequest, ExposePortRequest,
    SetTtlRequest, Validate, MAX_ARGV, MAX_FILE_BYTES, MAX_JSON_BODY_BYTES,
};

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

fn doc() -> Value {
    serde_json::to_value(ApiDoc::openapi()).expect("the document serializes")
}

/// (path, method, operation) of every documented operation.
fn operations(doc: &Value) -> Vec<(String, &'static str, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if let Some(op) = item.get(m) {
                out.push((path.clone(), m, op.clone()));
            }
        }
    }
    assert!(out.len() > 20, "only {} operations documented", out.len());
    out
}

fn error_response(op: &Value, status: &str) -> bool {
    op["responses"][status]["content"]["application/json"]["schema"]["$ref"]
        == "#/components/schemas/ErrorBody"
}

#[test]
fn every_protected_operation_documents_401_and_public_ones_need_no_token() {
    let doc = doc();
    assert_eq!(doc["security"], json!([{"bearer": []}]));
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let mut public_seen = 0;
    for (path, method, op) in operations(&doc) {
        if PUBLIC.contains(&path.as_str()) {
            public_seen += 1;
            assert_eq!(
                op["security"],
                json!([{}]),
                "{method} {path} needs no token"
            );
            assert!(op["responses"].get("401").is_none(), "{method} {path}");
        } else {
            assert!(
                op.get("security").is_none(),
                "{method} {path} uses the global bearer"
            );
            assert!(
                error_response(&op, "401"),
                "{method} {path} documents no 401"
            );
        }
    }
    assert_eq!(public_seen, PUBLIC.len());
}

#[test]
fn every_body_documents_400_and_413() {
    let doc = doc();
    for (path, method, op) in operations(&doc) {
        if op.get("requestBody").is_some() {
            for status in ["400", "413"] {
                assert!(error_response(&op, status), "{method} {path}: no {status}");
            }
        }
    }
    let description = doc["info"]["description"].as_str().unwrap();
    for mib in [MAX_JSON_BODY_BYTES >> 20, MAX_FILE_BYTES >> 20] {
        assert!(description.contains(&format!("{mib} MiB")), "{description}");
    }
}

#[test]
fn parameters_are_where_the_router_reads_them() {
    let doc = doc();
    let mut query_seen = 0;
    for (path, method, op) in operations(&doc) {
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        let template: Vec<&str> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        for p in &params {
            let name = p["name"].as_str().unwrap();
            match p["in"].as_str().unwrap() {
                "path" => assert!(
                    template.contains(&name),
                    "{method} {path}: {name} is documented as a path parameter"
                ),
                "query" => query_seen += 1,
                // The one header a route reads as a parameter: SSE's reconnect point.
                "header" if path == "/v1/events" && name == "Last-Event-ID" => {}
                other => panic!("{method} {path}: {name} in {other}"),
            }
        }
        for name in template {
            assert!(
                params
                    .iter()
                    .any(|p| p["name"] == name && p["in"] == "path"),
                "{method} {path}: {{{name}}} is not documented"
            );
        }
        let expected: &[(&str, bool)] = if path.ends_with("/diff") {
            &[("against", true), ("path", false), ("content", false)]
        } else if path.ends_with("/pty") {
            &[
                ("cols", true),
                ("rows", true),
                ("cmd", false),
                ("env", false),
                ("cwd", false),
            ]
        } else if path.ends_with("/files/watch") {
            &[("path", true), ("recursive", false)]
        } else if path.contains("/files") {
            &[("path", true), ("mode", false), ("special", false)]
        } else if path.ends_with("/logs") {
            &[("tail_bytes", false)]
        } else if path.ends_with("/metrics") && path.starts_with("/v1/") {
            &[("start", false), ("end", false)]
        } else {
            &[]
        };
        for &(name, required) in expected {
            let p = params
                .iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("{method} {path}: no {name}"));
            assert_eq!(p["in"], "query", "{method} {path}: {name}");
            assert_eq!(p["required"], required, "{method} {path}: {name}");
        }
        if path == "/v1/sandboxes" && method == "get" {
            let p = params
                .iter()
                .find(|p| p["name"] == "metadata")
                .expect("GET /v1/sandboxes: no metadata filter");
            assert_eq!(p["in"], "query");
            assert_eq!(p["explode"], true, "repeated metadata=key=value");
        }
        if path.ends_with("/output") {
            for name in ["offset", "wait_ms", "follow"] {
                let p = params
                    .iter()
                    .find(|p| p["name"] == name)
                    .unwrap_or_else(|| panic!("{method} {path}: no {name}"));
                assert_eq!(p["in"], "query", "{method} {path}: {name}");
                assert_eq!(p["required"], false, "{method} {path}: {name}");
            }
        }
        if path.contains("/files") && !path.ends_with("/files/watch") {
            for (name, required) in [("path", true), ("mode", false), ("special", false)] {
                let p = params
                    .iter()
                    .find(|p| p["name"] == name)
                    .unwrap_or_else(|| panic!("{method} {path}: no {name}"));
                assert_eq!(p["in"], "query", "{method} {path}: {name}");
                assert_eq!(p["required"], required, "{method} {path}: {name}");
            }
        }
    }
    assert_eq!(
        query_seen, 37,
        "path, mode, special on three file routes; path, recursive on the watch; against, path, content on diff; \
         the list's metadata filter; offset, wait_ms, follow on process output; \
         cols, rows, cmd, env, cwd on pty; name on snapshot import; tail_bytes on logs; \
         since_ms, until_ms, limit, order, level, search on events; sandbox, level on the event stream; \
         start, end on metrics; \
         limit, follow on egress"
    );
}

/// Whether the API accepts `body` as a `T`: it parses and validates.
fn accepts<T: DeserializeOwned + Validate>(body: &Value) -> bool {
    serde_json::from_value::<T>(body.clone()).is_ok_and(|r| r.validate().is_ok())
}

/// `base` with the field at `at` (a path of object keys) set to `v`.
fn with(base: &Value, at: &[&str], v: u64) -> Value {
    let mut body = base.clone();
    let mut slot = &mut body;
    for key in at {
        slot = &mut slot[*key];
    }
    *slot = json!(v);
    body
}

#[test]
fn documented_ranges_are_what_validation_accepts() {
    type Accepts = fn(&Value) -> bool;
    let create = json!({"image": "minimal", "limits": {}});
    let cases: &[(&str, &[&str], Value, Accepts)] = &[
        (
            "CreateSandboxRequest",
            &["n"],
            create.clone(),
            accepts::<CreateSandboxRequest>,
        ),
        (
            "CreateSandboxRequest",
            &["mem_mib"],
            create.clone(),
            accepts::<CreateSandboxRequest>,
        ),
        (
            "CreateSandboxRequest",
            &["vcpus"],
            create.clone(),
            accepts::<CreateSandboxRequest>,
        ),
        (
            "CreateSandboxRequest",
            &["ttl_secs"],
            create.clone(),
            accepts::<CreateSandboxRequest>,
        ),
        (
            "Limits",
            &["limits", "memory_mib"],
            create.clone(),
            accepts::<CreateSandboxRequest>,
        ),
        (
            "Limits",
            &["limits", "cpu_percent"],
            create.clone(),
            accepts::<CreateSandboxRequest>,
        ),
        (
            "Limits",
            &["limits", "pids"],
            create,
            accepts::<CreateSandboxRequest>,
        ),
        (
            "BranchRequest",
            &["count"],
            json!({}),
            accepts::<BranchRequest>,
        ),
        (
            "BranchRequest",
            &["ttl_secs"],
            json!({}),
            accepts::<BranchRequest>,
        ),
        (
            "SetTtlRequest",
            &["ttl_secs"],
            json!({"ttl_secs": null}),
            accepts::<SetTtlRequest>,
        ),
        (
            "ExecRequest",
            &["timeout_ms"],
            json!({"argv": ["true"]}),
            accepts::<ExecRequest>,
        ),
        (
            "ExposePortRequest",
            &["port"],
            json!({"port": 80}),
            accepts::<ExposePortRequest>,
        ),
    ];
    let doc = doc();
    for (schema, at, base, accepts) in cases {
        let field = at.last().unwrap();
        let prop = &doc["components"]["schemas"][schema]["properties"][field];
        let bound = |k: &str| {
            prop[k]
                .as_u64()
                .unwrap_or_else(|| panic!("{schema}.{field} documents no {k}: {prop}"))
        };
        let (lo, hi) = (bound("minimum"), bound("maximum"));
        assert!(accepts(base), "{schema}: the base body is valid");
        assert!(
            accepts(&with(base, at, lo)),
            "{schema}.{field} = minimum {lo}"
        );
        assert!(
            accepts(&with(base, at, hi)),
            "{schema}.{field} = maximum {hi}"
        );
        assert!(
            !accepts(&with(base, at, lo - 1)),
            "{schema}.{field} = {}",
            lo - 1
        );
        assert!(
            !accepts(&with(base, at, hi + 1)),
            "{schema}.{field} = {}",
            hi + 1
        );
    }
}

#[test]
fn documented_argv_bounds_are_what_validation_accepts() {
    let doc = doc();
    let argv = &doc["components"]["schemas"]["ExecRequest"]["properties"]["argv"];
    assert_eq!(argv["minItems"], 1, "{argv}");
    assert_eq!(argv["maxItems"], MAX_ARGV, "{argv}");
    let exec = |n: usize| json!({ "argv": vec!["x"; n] });
    assert!(!accepts::<ExecRequest>(&exec(0)));
    assert!(accepts::<ExecRequest>(&exec(1)));
    assert!(accepts::<ExecRequest>(&exec(MAX_ARGV)));
    assert!(!accepts::<ExecRequest>(&exec(MAX_ARGV + 1)));
}

#[test]
fn file_contents_are_documented_as_binary() {
    let doc = doc();
    let files = &doc["paths"]["/v1/sandboxes/{id}/files"];
    let schema_of = |v: &Value| {
        let s = &v["application/octet-stream"]["schema"];
        match s["$ref"].as_str() {
            Some(r) => doc["components"]["schemas"][r.rsplit('/').next().unwrap()].clone(),
            None => s.clone(),
        }
    };
    for contents in [
        &files["get"]["responses"]["200"]["content"],
        &files["put"]["requestBody"]["content"],
    ] {
        let s = schema_of(contents);
        assert_eq!(
            (&s["type"], &s["format"]),
            (&json!("string"), &json!("binary")),
            "{s}"
        );
    }
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                out.push(r.clone());
            }
            map.values().for_each(|x| collect_refs(x, out));
        }
        Value::Array(items) => items.iter().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

#[test]
fn every_schema_reference_resolves() {
    // A query-only type (EventOrder) was once referenced but never registered, so
    // clients and the conformance run skipped that parameter.
    let doc = doc();
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(refs.len() > 50, "only {} references", refs.len());
    for r in refs {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("unexpected reference {r}"));
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "{r} is referenced but not in components"
        );
    }
}

#[test]
fn operations_on_a_named_code_context_document_the_malformed_name() {
    let doc = doc();
    let mut seen = 0;
    for (path, method, op) in operations(&doc) {
        if path.contains("{context}") {
            seen += 1;
            assert!(error_response(&op, "400"), "{method} {path} lacks its 400");
        }
    }
    assert_eq!(seen, 2);
}

#[test]
fn code_envs_are_documented_as_validation_bounds_them() {
    let doc = doc();
    let envs = &doc["components"]["schemas"]["CodeRequest"]["properties"]["envs"];
    assert_eq!(envs["additionalProperties"]["type"], "string", "{envs}");
    let text = envs["description"].as_str().unwrap_or_default();
    assert!(
        text.contains("At most 64") && text.contains("1..=128 bytes") && text.contains("32 KiB"),
        "{envs}"
    );
    let code = "/v1/sandboxes/{id}/code";
    let bad = doc["paths"][code]["post"]["responses"]["400"]["description"].to_string();
    assert!(bad.contains("envs"), "{bad}");
    let vars = |n: usize| {
        let envs: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("V{i}"), json!("x"))).collect();
        json!({"code": "1", "envs": envs})
    };
    assert!(accepts::<CodeRequest>(&vars(64)));
    assert!(!accepts::<CodeRequest>(&vars(65)));
    assert!(!accepts::<CodeRequest>(
        &json!({"code": "1", "envs": {"N".repeat(129): "x"}})
    ));
}
