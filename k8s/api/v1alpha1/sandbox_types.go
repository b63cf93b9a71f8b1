package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels, annotations and finalizers zygote puts on objects.
const (
	// LabelPool names the SandboxWarmPool a ready, unclaimed Sandbox belongs to.
	LabelPool = "zygote.dev/pool"
	// LabelClaim names the SandboxClaim a Sandbox is bound to.
	LabelClaim = "zygote.dev/claim"
	// LabelTemplate names the SandboxTemplate a Sandbox was made from.
	LabelTemplate = "zygote.dev/template"
	// FinalizerVM is set by the node agent before it creates a VM, and removed once the
	// VM is gone (or, for a Sandbox whose node was lost, by the controller).
	FinalizerVM = "zygote.dev/vm"
	// DaemonKeyUID is the daemon-side metadata key holding the Sandbox's UID: how a
	// restarted node agent finds the VMs that exist instead of creating duplicates.
	DaemonKeyUID = "k8s.zygote.dev/uid"
	// DaemonKeyName is the daemon-side metadata key holding namespace/name (for people).
	DaemonKeyName = "k8s.zygote.dev/name"
)

// SandboxPhase is where a Sandbox is in its life.
// +kubebuilder:validation:Enum=Pending;Creating;Running;Failed;Lost;Expired
type SandboxPhase string

const (
	// PhasePending: not placed yet, or placed and waiting for its node agent.
	PhasePending SandboxPhase = "Pending"
	// PhaseCreating: its node's daemon is booting (or branching) the VM.
	PhaseCreating SandboxPhase = "Creating"
	// PhaseRunning: the VM runs and its agent answers.
	PhaseRunning SandboxPhase = "Running"
	// PhaseFailed: the daemon refused it or its VM died (the Ready condition says why).
	PhaseFailed SandboxPhase = "Failed"
	// PhaseLost: its node stopped renewing its Lease for longer than the grace period.
	PhaseLost SandboxPhase = "Lost"
	// PhaseExpired: its ttlSeconds ran out and the daemon deleted the VM.
	PhaseExpired SandboxPhase = "Expired"
)

// Terminal says whether nothing more will happen to a Sandbox in this phase.
func (p SandboxPhase) Terminal() bool {
	return p == PhaseFailed || p == PhaseLost || p == PhaseExpired
}

// Condition types and reasons.
const (
	// ConditionScheduled: the controller placed the Sandbox on a node (or says why not).
	ConditionScheduled = "Scheduled"
	// ConditionReady: the VM runs (or why it does not).
	ConditionReady = "Ready"

	ReasonPlaced            = "Placed"
	ReasonUnschedulable     = "Unschedulable"
	ReasonParentNotReady    = "ParentNotReady"
	ReasonParentNodeFull    = "ParentNodeFull"
	ReasonSnapshotNotFound  = "SnapshotNotFound"
	ReasonCreating          = "Creating"
	ReasonRunning           = "Running"
	ReasonAdopted           = "Adopted"
	ReasonDaemonRefused     = "DaemonRefused"
	ReasonDaemonUnavailable = "DaemonUnavailable"
	ReasonVMExited          = "VMExited"
	ReasonVMGone            = "VMGone"
	ReasonTTLExpired        = "TTLExpired"
	ReasonNodeLost          = "NodeLost"
	ReasonWaitingForParent  = "WaitingForParent"
	ReasonParentOnOtherNode = "ParentOnOtherNode"
	ReasonMovedAsPack       = "PlacedViaSnapshotPack"
	ReasonWaitingForPack    = "WaitingForPack"
	ReasonPackFailed        = "PackFailed"
	ReasonTemplateNotFound  = "TemplateNotFound"
	ReasonFromWarmPool      = "FromWarmPool"
	ReasonCreatedForClaim   = "CreatedForClaim"
	ReasonSandboxGone       = "SandboxGone"
)

// SandboxParams is what a VM is made from: shared by Sandbox and SandboxTemplate.
type SandboxParams struct {
	// Image to boot: a zygote image name (`minimal`) or an OCI reference
	// (`python:3.12-slim`), pulled by the node's daemon on first use.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=200
	// +optional
	Image string `json:"image,omitempty"`

	// Snapshot to start from: a snapshot id or name on one node's daemon. Only nodes
	// holding it qualify (snapshot packs do not move between nodes yet).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=200
	// +optional
	Snapshot string `json:"snapshot,omitempty"`

	// Resources of the VM (image boots only: a snapshot or branch keeps its own).
	// +optional
	Resources *Resources `json:"resources,omitempty"`

	// Network policy of the guest.
	// +optional
	Network *NetworkPolicy `json:"network,omitempty"`

	// TTLSeconds: the daemon deletes the VM this long after it runs (phase Expired).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=604800
	// +optional
	TTLSeconds *int64 `json:"ttlSeconds,omitempty"`

	// Env: environment variables every exec in the sandbox gets.
	// +kubebuilder:validation:MaxProperties=128
	// +optional
	Env map[string]string `json:"env,omitempty"`
}

// Resources of one VM.
type Resources struct {
	// MemoryMiB of guest RAM (default 256).
	// +kubebuilder:validation:Minimum=64
	// +kubebuilder:validation:Maximum=65536
	// +optional
	MemoryMiB int32 `json:"memoryMiB,omitempty"`

	// VCPUs of the guest (default 1).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	// +optional
	VCPUs int32 `json:"vcpus,omitempty"`
}

// NetworkPolicy of a guest, as the daemon applies it (nftables in the sandbox's own
// network namespace).
type NetworkPolicy struct {
	// Mode: `egress` (outbound through NAT, never to the host or other sandboxes) or
	// `none` (no traffic at all).
	// +kubebuilder:validation:Enum=egress;none
	// +kubebuilder:default=egress
	// +optional
	Mode string `json:"mode,omitempty"`

	// AllowOut: when given, the only IPv4 CIDRs (or addresses) reachable.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:Pattern=`^([0-9]{1,3}\.){3}[0-9]{1,3}(/[0-9]{1,2})?$`
	// +optional
	AllowOut []string `json:"allowOut,omitempty"`

	// DenyOut: IPv4 CIDRs always refused, checked first.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:Pattern=`^([0-9]{1,3}\.){3}[0-9]{1,3}(/[0-9]{1,2})?$`
	// +optional
	DenyOut []string `json:"denyOut,omitempty"`
}

// BranchFrom makes a Sandbox by branching a running one: the children are
// copy-on-write copies of its live state (memory, processes, files), made on the
// parent's node in one branch call.
type BranchFrom struct {
	// Sandbox: the name of the parent Sandbox, in the same namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Sandbox string `json:"sandbox"`

	// Count of children made by one branch (default 1). They share one branch point
	// and are listed in status.sandboxIDs.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	// +kubebuilder:default=1
	// +optional
	Count int32 `json:"count,omitempty"`

	// SnapshotPack: when the parent's node cannot take the children, move the branch
	// point instead of waiting: the parent's node snapshots the parent and pushes it as
	// a snapshot pack to this repository, and the children start on another node from
	// that pack (a copy of the parent at that moment, not a live fork). Without it, a
	// branch runs on its parent's node or stays Pending (ParentNodeFull).
	// +optional
	SnapshotPack *SnapshotPackMove `json:"snapshotPack,omitempty"`
}

// SnapshotPackMove says where a branch point travels between nodes.
type SnapshotPackMove struct {
	// Repository the pack is pushed to and pulled from (`registry:5000/team/points`);
	// the tag is the child Sandbox's UID. Nodes use their daemon's registry credentials.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=400
	// +kubebuilder:validation:Pattern=`^[a-z0-9.:-]+(/[a-z0-9._-]+)+$`
	Repository string `json:"repository"`
}

// AnnotationPackPrefix: the controller asks a parent's node agent to push the parent
// as a snapshot pack for a moved branch with the annotation
// `pack.zygote.dev/<child UID>: <reference>`.
const AnnotationPackPrefix = "pack.zygote.dev/"

// PushedPack is a snapshot pack a node agent pushed of a Sandbox, for a moved branch.
type PushedPack struct {
	// Reference pushed (`repository:<child UID>`).
	Reference string `json:"reference"`
	// Digest of the pack's manifest.
	// +optional
	Digest string `json:"digest,omitempty"`
	// Error: why the push failed (then Digest is empty).
	// +optional
	Error string `json:"error,omitempty"`
}

// SandboxSpec is the desired VM.
// +kubebuilder:validation:XValidation:rule="[has(self.image), has(self.snapshot), has(self.branchFrom)].filter(x, x).size() == 1",message="give exactly one of image, snapshot or branchFrom"
// +kubebuilder:validation:XValidation:rule="!has(self.resources) || has(self.image)",message="resources apply to image boots only: a snapshot or a branch keeps its own memory and vCPUs"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.nodeName) || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)",message="nodeName cannot change once set"
// +kubebuilder:validation:XValidation:rule="has(self.image) == has(oldSelf.image) && has(self.snapshot) == has(oldSelf.snapshot) && has(self.branchFrom) == has(oldSelf.branchFrom)",message="a Sandbox cannot switch between image, snapshot and branchFrom"
type SandboxSpec struct {
	SandboxParams `json:",inline"`

	// BranchFrom: branch a running Sandbox instead of booting an image.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="branchFrom is immutable"
	// +optional
	BranchFrom *BranchFrom `json:"branchFrom,omitempty"`

	// NodeName: the ZygoteNode that runs it. Set by the controller when it places the
	// Sandbox (or by you, to pin it); it never changes afterwards.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	NodeName string `json:"nodeName,omitempty"`
}

// Endpoints of a running sandbox.
type Endpoints struct {
	// API: base URL of its node's daemon (`POST {api}/v1/sandboxes/{sandboxID}/exec`).
	API string `json:"api,omitempty"`
	// Exec: the exec URL of the (first) VM.
	Exec string `json:"exec,omitempty"`
}

// SandboxStatus is what the node agent (and, before placement and on node loss, the
// controller) observed.
type SandboxStatus struct {
	// Phase: Pending, Creating, Running, Failed, Lost or Expired.
	// +optional
	Phase SandboxPhase `json:"phase,omitempty"`
	// Node it runs on (written by that node's agent).
	// +optional
	Node string `json:"node,omitempty"`
	// SandboxID: the daemon's id of the VM (the first child, for a branch).
	// +optional
	SandboxID string `json:"sandboxID,omitempty"`
	// SandboxIDs: every VM of a branch (count children), or the one VM.
	// +optional
	SandboxIDs []string `json:"sandboxIDs,omitempty"`
	// Endpoints to reach it through its node's daemon.
	// +optional
	Endpoints *Endpoints `json:"endpoints,omitempty"`
	// MemoryMiB and VCPUs the VM got.
	// +optional
	MemoryMiB int32 `json:"memoryMiB,omitempty"`
	// +optional
	VCPUs int32 `json:"vcpus,omitempty"`
	// StartedAt: when the VM was running.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// ExpiresAt: when its TTL runs out.
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`
	// Packs: snapshot packs pushed of this Sandbox for branches moved to other nodes.
	// +optional
	Packs []PushedPack `json:"packs,omitempty"`
	// ObservedGeneration of the spec this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Scheduled (controller) and Ready (node agent), with reasons.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Sandbox is one zygote microVM (or, with branchFrom.count > 1, the children of one
// branch) on one node.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=zsb;zsbx,categories=zygote
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Sandbox-ID",type=string,JSONPath=`.status.sandboxID`
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`
// +kubebuilder:printcolumn:name="Parent",type=string,JSONPath=`.spec.branchFrom.sandbox`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxSpec   `json:"spec"`
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxList is a list of Sandboxes.
// +kubebuilder:object:root=true
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Sandbox{}, &SandboxList{})
}

// MemoryMiB is what the VM asks for (the default when unset).
func (p *SandboxParams) MemoryMiB() int32 {
	if p.Resources != nil && p.Resources.MemoryMiB > 0 {
		return p.Resources.MemoryMiB
	}
	return DefaultMemoryMiB
}

// VCPUs is what the VM asks for (the default when unset).
func (p *SandboxParams) VCPUs() int32 {
	if p.Resources != nil && p.Resources.VCPUs > 0 {
		return p.Resources.VCPUs
	}
	return 1
}

// DefaultMemoryMiB is the daemon's default guest RAM.
const DefaultMemoryMiB = 256

// Count is the number of VMs the Sandbox stands for.
func (s *SandboxSpec) Count() int32 {
	if s.BranchFrom != nil && s.BranchFrom.Count > 0 {
		return s.BranchFrom.Count
	}
	return 1
}
