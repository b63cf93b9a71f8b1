package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SandboxWarmPoolSpec: how many ready Sandboxes of which template to keep.
type SandboxWarmPoolSpec struct {
	// Replicas: ready, unclaimed Sandboxes to keep. A claimed one leaves the pool and
	// is replaced; a Lost or Failed one is deleted and replaced (on a live node).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Replicas int32 `json:"replicas"`

	// SandboxTemplateRef: the template its Sandboxes are made from.
	SandboxTemplateRef TemplateRef `json:"sandboxTemplateRef"`
}

// SandboxWarmPoolStatus counts the pool's Sandboxes.
type SandboxWarmPoolStatus struct {
	// Replicas: the pool's Sandboxes that are not Lost/Failed/being deleted.
	// +optional
	Replicas int32 `json:"replicas"`
	// ReadyReplicas: those Running.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`
	// Selector of the pool's Sandboxes (for the scale subresource).
	// +optional
	Selector string `json:"selector,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SandboxWarmPool keeps N ready Sandboxes of a template, so that a claim binds one at
// once instead of waiting for a boot.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=zswp,categories=zygote
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.sandboxTemplateRef.name`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxWarmPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxWarmPoolSpec   `json:"spec"`
	Status SandboxWarmPoolStatus `json:"status,omitempty"`
}

// SandboxWarmPoolList is a list of SandboxWarmPools.
// +kubebuilder:object:root=true
type SandboxWarmPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxWarmPool `json:"items"`
}

func init() {
	SchemeBuilder.Register(&SandboxWarmPool{}, &SandboxWarmPoolList{})
}
