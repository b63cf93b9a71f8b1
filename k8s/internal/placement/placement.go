// Package placement decides which node runs a Sandbox: pure functions of the nodes'
// capacity, what they hold and what is already placed on them (unit-tested without an
// API server).
package placement

import (
	"fmt"
	"sort"
	"strings"
)

// Node is what the scheduler knows about one ZygoteNode.
type Node struct {
	Name string
	// Ready: its Lease is fresh.
	Ready bool
	// Unschedulable: cordoned by the operator.
	Unschedulable bool
	// Capacity offered to guests.
	MemoryMiB int64
	VCPUs     int64
	// Used: what the Sandboxes placed on it (and not terminal) ask for.
	UsedMemoryMiB int64
	UsedVCPUs     int64
	// Images and Snapshots it holds (names, ids).
	Images    map[string]bool
	Snapshots map[string]bool
}

// FreeMemoryMiB left on the node.
func (n *Node) FreeMemoryMiB() int64 { return n.MemoryMiB - n.UsedMemoryMiB }

// FreeVCPUs left on the node.
func (n *Node) FreeVCPUs() int64 { return n.VCPUs - n.UsedVCPUs }

// Request is what one Sandbox needs.
type Request struct {
	MemoryMiB int64
	VCPUs     int64
	// Image it boots (locality: a node that has it cached wins).
	Image string
	// Snapshot it starts from (only nodes holding it qualify).
	Snapshot string
	// ParentNode: for a branch, the parent's node (the only one that qualifies).
	ParentNode string
}

// Decision is where a Sandbox goes, or why it goes nowhere yet.
type Decision struct {
	// Node chosen ("" when none).
	Node string
	// Reason: a Sandbox condition reason (Placed, Unschedulable, ParentNodeFull,
	// ParentNotReady, SnapshotNotFound).
	Reason string
	// Message for people: why this node, or why none.
	Message string
}

// Reasons (the same strings as the Sandbox condition reasons).
const (
	Placed           = "Placed"
	Unschedulable    = "Unschedulable"
	ParentNodeFull   = "ParentNodeFull"
	ParentNotReady   = "ParentNotReady"
	SnapshotNotFound = "SnapshotNotFound"
)

// whyNot says why n cannot take r ("" if it can).
func whyNot(n *Node, r Request) string {
	switch {
	case !n.Ready:
		return "not ready (lease expired)"
	case n.Unschedulable:
		return "unschedulable"
	case n.FreeMemoryMiB() < r.MemoryMiB:
		return fmt.Sprintf("%d MiB free < %d MiB", n.FreeMemoryMiB(), r.MemoryMiB)
	case n.FreeVCPUs() < r.VCPUs:
		return fmt.Sprintf("%d vCPUs free < %d", n.FreeVCPUs(), r.VCPUs)
	}
	return ""
}

// Place picks the node for r. Rules, in order:
//  1. A branch goes to its parent's node or nowhere: the fork is node-local (cheap),
//     moving the branch point elsewhere would mean shipping a snapshot pack.
//  2. A snapshot boot goes only to a node holding the snapshot.
//  3. Of the nodes that are ready, schedulable and have room, one that already has the
//     image cached wins (no pull); then the one with the most free memory after
//     placement (spreading, so one lost node loses few Sandboxes); then the name.
func Place(r Request, nodes []Node) Decision {
	if r.ParentNode != "" {
		for i := range nodes {
			n := &nodes[i]
			if n.Name != r.ParentNode {
				continue
			}
			if !n.Ready {
				return Decision{Reason: ParentNotReady, Message: fmt.Sprintf(
					"the parent's node %s is not ready; a branch runs on its parent's node", n.Name)}
			}
			if why := whyNot(n, r); why != "" {
				return Decision{Reason: ParentNodeFull, Message: fmt.Sprintf(
					"the parent's node %s cannot take the branch: %s; a branch stays on its "+
						"parent's node unless branchFrom.snapshotPack lets its branch point move "+
						"to another node as a snapshot pack", n.Name, why)}
			}
			return Decision{Node: n.Name, Reason: Placed, Message: fmt.Sprintf(
				"branch placed on its parent's node %s (%d MiB free before)", n.Name, n.FreeMemoryMiB())}
		}
		return Decision{Reason: ParentNotReady, Message: fmt.Sprintf(
			"the parent's node %s is unknown", r.ParentNode)}
	}
	type cand struct {
		n        *Node
		local    bool
		freeMiB  int64
		freeCPUs int64
	}
	var cands []cand
	var refusals []string
	holders := 0
	for i := range nodes {
		n := &nodes[i]
		if r.Snapshot != "" && !n.Snapshots[r.Snapshot] {
			continue
		}
		holders++
		if why := whyNot(n, r); why != "" {
			refusals = append(refusals, n.Name+": "+why)
			continue
		}
		cands = append(cands, cand{
			n:        n,
			local:    r.Snapshot != "" || (r.Image != "" && n.Images[r.Image]),
			freeMiB:  n.FreeMemoryMiB() - r.MemoryMiB,
			freeCPUs: n.FreeVCPUs() - r.VCPUs,
		})
	}
	if r.Snapshot != "" && holders == 0 {
		return Decision{Reason: SnapshotNotFound, Message: fmt.Sprintf(
			"no node holds snapshot %q (snapshot packs do not move between nodes yet)", r.Snapshot)}
	}
	if len(cands) == 0 {
		sort.Strings(refusals)
		return Decision{Reason: Unschedulable, Message: fmt.Sprintf(
			"0/%d nodes can take %d MiB, %d vCPU: %s", holders, r.MemoryMiB, r.VCPUs,
			orNone(strings.Join(refusals, "; ")))}
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.local != b.local {
			return a.local
		}
		if a.freeMiB != b.freeMiB {
			return a.freeMiB > b.freeMiB
		}
		if a.freeCPUs != b.freeCPUs {
			return a.freeCPUs > b.freeCPUs
		}
		return a.n.Name < b.n.Name
	})
	best := cands[0]
	why := "most free memory"
	if best.local {
		if r.Snapshot != "" {
			why = "holds snapshot " + r.Snapshot
		} else {
			why = "image " + r.Image + " cached"
		}
	}
	return Decision{Node: best.n.Name, Reason: Placed, Message: fmt.Sprintf(
		"placed on %s (%s; %d MiB free after)", best.n.Name, why, best.freeMiB)}
}

func orNone(s string) string {
	if s == "" {
		return "no nodes"
	}
	return s
}
