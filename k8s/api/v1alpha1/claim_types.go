package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClaimPhase is where a claim is.
// +kubebuilder:validation:Enum=Pending;Bound;Lost;Failed
type ClaimPhase string

const (
	// ClaimPending: its Sandbox is being made.
	ClaimPending ClaimPhase = "Pending"
	// ClaimBound: its Sandbox runs.
	ClaimBound ClaimPhase = "Bound"
	// ClaimLost: its Sandbox's node was lost.
	ClaimLost ClaimPhase = "Lost"
	// ClaimFailed: its Sandbox failed, expired or was deleted.
	ClaimFailed ClaimPhase = "Failed"
)

// ConditionBound: the claim holds a Sandbox (reason FromWarmPool or CreatedForClaim).
const ConditionBound = "Bound"

// SandboxClaimSpec: which template's Sandbox to get.
type SandboxClaimSpec struct {
	// SandboxTemplateRef: a ready Sandbox of a warm pool of this template is bound at
	// once; without one, a Sandbox is created from the template.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="sandboxTemplateRef is immutable"
	SandboxTemplateRef TemplateRef `json:"sandboxTemplateRef"`

	// WarmPool: take only from this pool (default: any pool of the template).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	WarmPool string `json:"warmPool,omitempty"`
}

// SandboxRef names the Sandbox a claim holds.
type SandboxRef struct {
	Name string `json:"name"`
}

// SandboxClaimStatus: the bound Sandbox and its state.
type SandboxClaimStatus struct {
	// +optional
	Phase ClaimPhase `json:"phase,omitempty"`
	// Sandbox: the bound Sandbox (owned by the claim: deleted with it).
	// +optional
	Sandbox *SandboxRef `json:"sandbox,omitempty"`
	// Node, SandboxID and Endpoints: copied from the Sandbox.
	// +optional
	Node string `json:"node,omitempty"`
	// +optional
	SandboxID string `json:"sandboxID,omitempty"`
	// +optional
	Endpoints *Endpoints `json:"endpoints,omitempty"`
	// BoundAt: when the claim got its Sandbox.
	// +optional
	BoundAt *metav1.Time `json:"boundAt,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SandboxClaim asks for a running Sandbox of a template, from a warm pool when one has
// a ready Sandbox.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=zsc,categories=zygote
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.sandboxTemplateRef.name`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.status.sandbox.name`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.node`
// +kubebuilder:printcolumn:name="From",type=string,JSONPath=`.status.conditions[?(@.type=="Bound")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxClaimSpec   `json:"spec"`
	Status SandboxClaimStatus `json:"status,omitempty"`
}

// SandboxClaimList is a list of SandboxClaims.
// +kubebuilder:object:root=true
type SandboxClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxClaim `json:"items"`
}

func init() {
	SchemeBuilder.Register(&SandboxClaim{}, &SandboxClaimList{})
}
