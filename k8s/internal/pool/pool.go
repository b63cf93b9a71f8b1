// Package pool holds the warm-pool and claim decisions as pure functions.
package pool

import (
	"sort"
	"time"
)

// Member is one Sandbox of a warm pool, as the pool controller sees it.
type Member struct {
	Name string
	// Phase of the Sandbox ("" before anyone wrote a status).
	Phase string
	// Deleting: it has a deletion timestamp.
	Deleting bool
	// Placed: it has a node.
	Placed  bool
	Created time.Time
}

func terminal(phase string) bool {
	return phase == "Failed" || phase == "Lost" || phase == "Expired"
}

// Plan is what to do to a pool.
type Plan struct {
	// Create this many new Sandboxes.
	Create int
	// Delete these (terminal ones first, then extras).
	Delete []string
	// Active: members that count towards replicas; Ready: those Running.
	Active, Ready int
}

// PlanPool brings a pool to want members: terminal members (Lost, Failed, Expired) are
// deleted and replaced; members being deleted do not count; extras are deleted, the
// least advanced first (unplaced, then not running, then the newest), so ready
// Sandboxes survive a scale-down.
func PlanPool(want int, members []Member) Plan {
	var p Plan
	var active []Member
	for _, m := range members {
		switch {
		case m.Deleting:
		case terminal(m.Phase):
			p.Delete = append(p.Delete, m.Name)
		default:
			active = append(active, m)
		}
	}
	p.Active = len(active)
	for _, m := range active {
		if m.Phase == "Running" {
			p.Ready++
		}
	}
	if len(active) < want {
		p.Create = want - len(active)
		return p
	}
	extra := len(active) - want
	if extra == 0 {
		return p
	}
	rank := func(m Member) int {
		switch {
		case !m.Placed:
			return 0
		case m.Phase != "Running":
			return 1
		}
		return 2
	}
	sort.SliceStable(active, func(i, j int) bool {
		a, b := active[i], active[j]
		if rank(a) != rank(b) {
			return rank(a) < rank(b)
		}
		if !a.Created.Equal(b.Created) {
			return a.Created.After(b.Created)
		}
		return a.Name > b.Name
	})
	for _, m := range active[:extra] {
		p.Delete = append(p.Delete, m.Name)
		if m.Phase == "Running" {
			p.Ready--
		}
	}
	p.Active -= extra
	return p
}

// ClaimOrder lists the members a claim may take, best first: Running and not being
// deleted, the oldest first (it has waited longest; all are equally warm).
func ClaimOrder(members []Member) []string {
	var ready []Member
	for _, m := range members {
		if m.Phase == "Running" && !m.Deleting {
			ready = append(ready, m)
		}
	}
	sort.SliceStable(ready, func(i, j int) bool {
		if !ready[i].Created.Equal(ready[j].Created) {
			return ready[i].Created.Before(ready[j].Created)
		}
		return ready[i].Name < ready[j].Name
	})
	names := make([]string, len(ready))
	for i, m := range ready {
		names[i] = m.Name
	}
	return names
}
