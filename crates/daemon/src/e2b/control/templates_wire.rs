//! The JSON of E2B's template API, with the field names of the SDK's generated client
//! (`e2b/api/client/models/template_*.py`, `build_*.py`); unknown fields are ignored.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /v3/templates` (TemplateBuildRequestV3).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildRequest {
    pub name: Option<String>,
    pub alias: Option<String>,
    pub tags: Option<Vec<String>>,
    pub cpu_count: Option<i64>,
    #[serde(rename = "memoryMB")]
    pub memory_mb: Option<i64>,
}

/// Its 202 (TemplateRequestResponseV3).
#[derive(Debug, Serialize)]
pub struct BuildRequested {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub public: bool,
    pub names: Vec<String>,
    pub tags: Vec<String>,
    pub aliases: Vec<String>,
}

/// `GET /templates/{id}/files/{hash}` → 201 (TemplateBuildFileUpload).
#[derive(Debug, Serialize)]
pub struct FileUpload {
    pub present: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
}

/// `POST /v2/templates/{id}/builds/{buildID}` (TemplateBuildStartV2).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStart {
    pub from_image: Option<String>,
    pub from_template: Option<String>,
    pub from_image_registry: Option<serde_json::Value>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub steps: Vec<Step>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

/// One step (TemplateStep).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_hash: Option<String>,
    #[serde(default)]
    pub force: bool,
}

/// A log line (BuildLogEntry).
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    pub timestamp: String,
    pub message: String,
    pub level: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// Why a build failed (BuildStatusReason); stored as JSON in its build row.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reason {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// The status answer's `reason`, with the failing step's log lines.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReasonAnswer {
    #[serde(flatten)]
    pub reason: Reason,
    pub log_entries: Vec<LogEntry>,
}

/// `GET /templates/{id}/builds/{buildID}/status` (TemplateBuildInfo).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatus {
    pub logs: Vec<String>,
    pub log_entries: Vec<LogEntry>,
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<ReasonAnswer>,
}

/// `GET /templates/aliases/{alias}` (TemplateAliasResponse).
#[derive(Debug, Serialize)]
pub struct AliasAnswer {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub public: bool,
}

/// `POST /templates/tags` (AssignTemplateTagsRequest).
#[derive(Debug, Deserialize)]
pub struct AssignTags {
    pub target: String,
    pub tags: Vec<String>,
}

/// Its 201 (AssignedTemplateTags).
#[derive(Debug, Serialize)]
pub struct AssignedTags {
    pub tags: Vec<String>,
    #[serde(rename = "buildID")]
    pub build_id: String,
}

/// `DELETE /templates/tags` (DeleteTemplateTagsRequest).
#[derive(Debug, Deserialize)]
pub struct DeleteTags {
    pub name: String,
    pub tags: Vec<String>,
}

/// An entry of `GET /templates/{id}/tags` (TemplateTag).
#[derive(Debug, Serialize)]
pub struct TagInfo {
    pub tag: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    #[serde(rename = "createdAt")]
    pub created_at: String,
}

/// What a template gives the sandboxes started from it (and later build steps): the
/// ENV, WORKDIR and USER steps so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Defaults {
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}
