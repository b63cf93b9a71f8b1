// zygote-controller places Sandboxes on ZygoteNodes, keeps SandboxWarmPools full,
// binds SandboxClaims, and marks the Sandboxes of nodes whose Lease expired Lost.
package main

import (
	"flag"
	"os"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/controller"
)

func main() {
	var (
		nodeNamespace = flag.String("node-namespace", "zygote-system", "namespace of the node agents' Leases")
		grace         = flag.Duration("node-lost-grace", 20*time.Second, "how long after a node's Lease expires its Sandboxes are marked Lost")
		sweep         = flag.Duration("node-sweep-interval", time.Second, "how often node Leases are checked")
		leaderElect   = flag.Bool("leader-elect", false, "elect one active controller (a Lease in --leader-election-namespace)")
		leNamespace   = flag.String("leader-election-namespace", "zygote-system", "namespace of the leader-election Lease")
		metricsAddr   = flag.String("metrics-bind-address", "0", "address of the metrics endpoint (0: off)")
		probeAddr     = flag.String("health-probe-bind-address", "0", "address of /healthz and /readyz (0: off)")
	)
	opts := zap.Options{Development: false}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	logger := ctrl.Log.WithName("zygote-controller")

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = zv1.AddToScheme(scheme)

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "zygote-controller",
		LeaderElectionNamespace: *leNamespace,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{*nodeNamespace: {}}},
		}},
	})
	if err != nil {
		logger.Error(err, "manager")
		os.Exit(1)
	}
	health := &controller.NodeHealth{Namespace: *nodeNamespace, Grace: *grace}
	must := func(what string, err error) {
		if err != nil {
			logger.Error(err, what)
			os.Exit(1)
		}
	}
	must("sandbox controller", (&controller.SandboxReconciler{Client: mgr.GetClient(),
		APIReader: mgr.GetAPIReader(), Health: health}).SetupWithManager(mgr))
	must("warm pool controller", (&controller.WarmPoolReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr))
	must("claim controller", (&controller.ClaimReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr))
	must("node watcher", mgr.Add(&controller.NodeWatcher{Client: mgr.GetClient(), Health: health, Interval: *sweep}))
	must("healthz", mgr.AddHealthzCheck("healthz", healthz.Ping))
	must("readyz", mgr.AddReadyzCheck("readyz", healthz.Ping))
	logger.Info("starting", "nodeNamespace", *nodeNamespace, "grace", grace.String())
	must("run", mgr.Start(ctrl.SetupSignalHandler()))
}
