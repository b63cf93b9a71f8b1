package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SandboxTemplateSpec is the VM that pools and claims make Sandboxes from.
// +kubebuilder:validation:XValidation:rule="has(self.image) != has(self.snapshot)",message="give exactly one of image or snapshot"
// +kubebuilder:validation:XValidation:rule="!has(self.resources) || has(self.image)",message="resources apply to image boots only: a snapshot keeps its own memory and vCPUs"
type SandboxTemplateSpec struct {
	SandboxParams `json:",inline"`
}

// SandboxTemplate is a reusable Sandbox spec.
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=zst,categories=zygote
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`
// +kubebuilder:printcolumn:name="Snapshot",type=string,JSONPath=`.spec.snapshot`
// +kubebuilder:printcolumn:name="Memory-MiB",type=integer,JSONPath=`.spec.resources.memoryMiB`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SandboxTemplateSpec `json:"spec"`
}

// SandboxTemplateList is a list of SandboxTemplates.
// +kubebuilder:object:root=true
type SandboxTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxTemplate `json:"items"`
}

// TemplateRef names a SandboxTemplate in the same namespace.
type TemplateRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

func init() {
	SchemeBuilder.Register(&SandboxTemplate{}, &SandboxTemplateList{})
}
