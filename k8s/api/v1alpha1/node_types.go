package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ZygoteNodeSpec: what the operator says about a node.
type ZygoteNodeSpec struct {
	// Unschedulable: place no new Sandboxes here (branches of Sandboxes already here
	// are refused too). Existing ones keep running.
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`
}

// NodeCapacity is what a node offers to Sandboxes.
type NodeCapacity struct {
	// MemoryMiB for guest RAM.
	MemoryMiB int64 `json:"memoryMiB"`
	// VCPUs for guests.
	VCPUs int32 `json:"vcpus"`
}

// ZygoteNodeStatus: written by the node agent from its daemon.
type ZygoteNodeStatus struct {
	// DaemonURL: where the node's zygoted listens.
	// +optional
	DaemonURL string `json:"daemonURL,omitempty"`
	// DaemonVersion reported by GET /v1/info.
	// +optional
	DaemonVersion string `json:"daemonVersion,omitempty"`
	// Runtime new sandboxes use (`qemu` or `kvm`), and every one the daemon offers.
	// +optional
	Runtime string `json:"runtime,omitempty"`
	// +optional
	Runtimes []string `json:"runtimes,omitempty"`
	// Capacity offered to Sandboxes.
	// +optional
	Capacity *NodeCapacity `json:"capacity,omitempty"`
	// Allocated: what the node's own VMs use (the controller also counts what it placed).
	// +optional
	Allocated *NodeCapacity `json:"allocated,omitempty"`
	// Sandboxes: VMs the daemon runs for Kubernetes Sandboxes.
	// +optional
	Sandboxes int32 `json:"sandboxes"`
	// Images cached on the node (names and `name-sha256` forms).
	// +optional
	Images []string `json:"images,omitempty"`
	// Snapshots held by the node's daemon (ids and names).
	// +optional
	Snapshots []string `json:"snapshots,omitempty"`
	// LeaseName: the coordination.k8s.io Lease the node agent renews.
	// +optional
	LeaseName string `json:"leaseName,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ZygoteNode is one host running zygoted and its node agent. Its heartbeat is the
// Lease `zygote-node-<name>` in the node agents' namespace.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=znode,categories=zygote
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Runtime",type=string,JSONPath=`.status.runtime`
// +kubebuilder:printcolumn:name="Memory-MiB",type=integer,JSONPath=`.status.capacity.memoryMiB`
// +kubebuilder:printcolumn:name="Sandboxes",type=integer,JSONPath=`.status.sandboxes`
// +kubebuilder:printcolumn:name="Unschedulable",type=boolean,JSONPath=`.spec.unschedulable`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ZygoteNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ZygoteNodeSpec   `json:"spec,omitempty"`
	Status ZygoteNodeStatus `json:"status,omitempty"`
}

// ZygoteNodeList is a list of ZygoteNodes.
// +kubebuilder:object:root=true
type ZygoteNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ZygoteNode `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ZygoteNode{}, &ZygoteNodeList{})
}

// LeaseName is the name of a node's heartbeat Lease.
func LeaseName(node string) string { return "zygote-node-" + node }
