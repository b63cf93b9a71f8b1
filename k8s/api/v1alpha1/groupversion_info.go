// Package v1alpha1 holds zygote's Kubernetes API: Sandbox, SandboxTemplate,
// SandboxWarmPool, SandboxClaim (names and meanings aligned with SIG agent-sandbox
// where they match) and ZygoteNode (one per host running zygoted).
// +kubebuilder:object:generate=true
// +groupName=zygote.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every zygote kind.
	GroupVersion = schema.GroupVersion{Group: "zygote.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the kinds of this group-version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
