package controller

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/placement"
)

// NodeHealth is how the controller judges nodes by their Leases.
type NodeHealth struct {
	// Namespace of the node Leases.
	Namespace string
	// Grace after a Lease expires before the node's Sandboxes are marked Lost.
	Grace time.Duration
	// Now is the clock (tests may replace it).
	Now func() time.Time
}

// nodeState is one node's liveness at a moment.
type nodeState struct {
	// Ready: the Lease is fresh.
	Ready bool
	// Lost: the Lease expired more than Grace ago, or the node is gone.
	Lost bool
	// Why, for messages.
	Why string
	// Expires: when the Lease runs out (zero without a Lease).
	Expires time.Time
}

func (h *NodeHealth) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// state of node name from its ZygoteNode (nil: none) and Lease (nil: none).
func (h *NodeHealth) state(name string, node *zv1.ZygoteNode, lease *coordinationv1.Lease) nodeState {
	if lease == nil || lease.Spec.RenewTime == nil || lease.Spec.LeaseDurationSeconds == nil {
		if node == nil {
			return nodeState{Lost: true, Why: "node " + name + " does not exist (no ZygoteNode, no Lease)"}
		}
		return nodeState{Why: "node " + name + " has not renewed its Lease yet"}
	}
	expires := lease.Spec.RenewTime.Time.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second)
	now := h.now()
	switch {
	case now.Before(expires):
		return nodeState{Ready: true, Expires: expires}
	case now.After(expires.Add(h.Grace)):
		return nodeState{Lost: true, Expires: expires, Why: "node " + name + " stopped renewing its Lease " +
			lease.Name + " (last renewed " + lease.Spec.RenewTime.Time.UTC().Format(time.RFC3339) +
			", expired " + expires.UTC().Format(time.RFC3339) + ", grace " + h.Grace.String() + ")"}
	default:
		return nodeState{Expires: expires, Why: "node " + name + "'s Lease expired at " +
			expires.UTC().Format(time.RFC3339)}
	}
}

// nodeStates reads every ZygoteNode and node Lease (from the cache) and judges them.
func (h *NodeHealth) nodeStates(ctx context.Context, c client.Reader) (map[string]nodeState, map[string]*zv1.ZygoteNode, error) {
	var nodes zv1.ZygoteNodeList
	if err := c.List(ctx, &nodes); err != nil {
		return nil, nil, err
	}
	var leases coordinationv1.LeaseList
	if err := c.List(ctx, &leases, client.InNamespace(h.Namespace)); err != nil {
		return nil, nil, err
	}
	byName := map[string]*coordinationv1.Lease{}
	for i := range leases.Items {
		byName[leases.Items[i].Name] = &leases.Items[i]
	}
	states := map[string]nodeState{}
	nodeMap := map[string]*zv1.ZygoteNode{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		nodeMap[n.Name] = n
		states[n.Name] = h.state(n.Name, n, byName[zv1.LeaseName(n.Name)])
	}
	return states, nodeMap, nil
}

// stateOf one node (a node missing from states is judged alone).
func (h *NodeHealth) stateOf(ctx context.Context, c client.Reader, name string) (nodeState, error) {
	var node zv1.ZygoteNode
	np := &node
	if err := c.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil {
		if client.IgnoreNotFound(err) != nil {
			return nodeState{}, err
		}
		np = nil
	}
	var lease coordinationv1.Lease
	lp := &lease
	if err := c.Get(ctx, types.NamespacedName{Namespace: h.Namespace, Name: zv1.LeaseName(name)}, &lease); err != nil {
		if client.IgnoreNotFound(err) != nil {
			return nodeState{}, err
		}
		lp = nil
	}
	return h.state(name, np, lp), nil
}

// assumed remembers placements the cache may not show yet (like kube-scheduler's
// assume cache), so two Sandboxes placed back to back do not both count a node's
// memory as free.
type assumed struct {
	mu sync.Mutex
	m  map[types.UID]assumption
}

type assumption struct {
	node      string
	memMiB    int64
	vcpus     int64
	createdAt time.Time
}

func (a *assumed) add(uid types.UID, x assumption) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[types.UID]assumption{}
	}
	a.m[uid] = x
}

// pending returns the assumptions the cache does not reflect yet: Sandboxes it still
// shows unplaced (present, not in seen: UIDs it shows with a node). Those it shows
// placed, those it no longer has (deleted) and stale ones are dropped.
func (a *assumed) pending(seen, present map[types.UID]bool) []assumption {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []assumption
	for uid, x := range a.m {
		if seen[uid] || !present[uid] || time.Since(x.createdAt) > time.Minute {
			delete(a.m, uid)
			continue
		}
		out = append(out, x)
	}
	return out
}

// demand is what a placed Sandbox takes from its node.
func demand(sb *zv1.Sandbox, parentMemMiB, parentVCPUs int64) (memMiB, vcpus int64) {
	count := int64(sb.Spec.Count())
	if sb.Spec.BranchFrom != nil {
		return parentMemMiB * count, parentVCPUs * count
	}
	if sb.Status.MemoryMiB > 0 {
		return int64(sb.Status.MemoryMiB) * count, int64(sb.Status.VCPUs) * count
	}
	return int64(sb.Spec.MemoryMiB()) * count, int64(sb.Spec.VCPUs()) * count
}

// usage of each node by the Sandboxes placed on it that still hold (or will hold) VMs.
func usage(sandboxes []zv1.Sandbox) (map[string][2]int64, map[types.UID]bool) {
	byName := map[string]*zv1.Sandbox{}
	for i := range sandboxes {
		byName[sandboxes[i].Namespace+"/"+sandboxes[i].Name] = &sandboxes[i]
	}
	used := map[string][2]int64{}
	seen := map[types.UID]bool{}
	for i := range sandboxes {
		sb := &sandboxes[i]
		if sb.Spec.NodeName == "" {
			continue
		}
		seen[sb.UID] = true
		if sb.Status.Phase.Terminal() {
			continue
		}
		pm, pv := int64(zv1.DefaultMemoryMiB), int64(1)
		if sb.Spec.BranchFrom != nil {
			if p := byName[sb.Namespace+"/"+sb.Spec.BranchFrom.Sandbox]; p != nil {
				pm, pv = demand(p, 0, 0)
				pm /= int64(p.Spec.Count())
				pv /= int64(p.Spec.Count())
			}
		}
		m, v := demand(sb, pm, pv)
		u := used[sb.Spec.NodeName]
		used[sb.Spec.NodeName] = [2]int64{u[0] + m, u[1] + v}
	}
	return used, seen
}

// placementNodes builds the scheduler's view of every node.
func placementNodes(states map[string]nodeState, nodes map[string]*zv1.ZygoteNode,
	used map[string][2]int64, pending []assumption) []placement.Node {
	for _, x := range pending {
		u := used[x.node]
		used[x.node] = [2]int64{u[0] + x.memMiB, u[1] + x.vcpus}
	}
	var out []placement.Node
	for name, n := range nodes {
		pn := placement.Node{
			Name:          name,
			Ready:         states[name].Ready,
			Unschedulable: n.Spec.Unschedulable,
			UsedMemoryMiB: used[name][0],
			UsedVCPUs:     used[name][1],
			Images:        map[string]bool{},
			Snapshots:     map[string]bool{},
		}
		if n.Status.Capacity != nil {
			pn.MemoryMiB = n.Status.Capacity.MemoryMiB
			pn.VCPUs = int64(n.Status.Capacity.VCPUs)
		}
		for _, i := range n.Status.Images {
			pn.Images[i] = true
		}
		for _, s := range n.Status.Snapshots {
			pn.Snapshots[s] = true
		}
		out = append(out, pn)
	}
	return out
}
