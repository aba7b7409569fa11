package k8s

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	inferencev1alpha2 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// Annotations of an InferenceObjective that give the default SLOs of the
// requests naming it, in milliseconds (the API has no field for them; a
// request's x-slo-ttft-ms and x-slo-tpot-ms headers override them).
const (
	AnnotationSLOTTFT = "kvroute.io/slo-ttft-ms"
	AnnotationSLOTPOT = "kvroute.io/slo-tpot-ms"
)

// setupObjectives adds the InferenceObjective controller: the pool's
// objectives (those in its namespace whose poolRef names it) are kept in
// the objectives store. A cluster without the CRD gets a warning and no
// objectives: every request then has priority 0, as without an objective.
func (d *Discovery) setupObjectives() error {
	gk := schema.GroupKind{Group: inferencev1alpha2.GroupName, Kind: "InferenceObjective"}
	if _, err := d.mgr.GetRESTMapper().RESTMapping(gk, inferencev1alpha2.GroupVersion.Version); err != nil {
		if meta.IsNoMatchError(err) {
			d.opts.Logger.Warn("the InferenceObjective CRD is not installed: requests keep priority 0 and no SLO defaults",
				"crd", "inferenceobjectives."+inferencev1alpha2.GroupName)
			return nil
		}
		return fmt.Errorf("k8s discovery: look up the InferenceObjective API: %w", err)
	}
	c := d.mgr.GetClient()
	err := ctrl.NewControllerManagedBy(d.mgr).
		Named("kvroute-inferenceobjective").
		For(&inferencev1alpha2.InferenceObjective{}).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			err := d.reconcileObjective(ctx, c, req.NamespacedName)
			d.m.reconciled("objective", err)
			return reconcile.Result{}, err
		}))
	if err != nil {
		return fmt.Errorf("k8s discovery: InferenceObjective controller: %w", err)
	}
	return nil
}

func (d *Discovery) reconcileObjective(ctx context.Context, c client.Reader, key types.NamespacedName) error {
	var obj inferencev1alpha2.InferenceObjective
	if err := c.Get(ctx, key, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			d.opts.Objectives.Delete(key.Name)
			return nil
		}
		return fmt.Errorf("get InferenceObjective %s: %w", key, err)
	}
	ref := obj.Spec.PoolRef
	if !obj.DeletionTimestamp.IsZero() || string(ref.Name) != d.opts.PoolName ||
		(ref.Group != "" && string(ref.Group) != DefaultPoolGroup) || (ref.Kind != "" && ref.Kind != "InferencePool") {
		// Another pool's objective (or one on its way out).
		d.opts.Objectives.Delete(key.Name)
		return nil
	}
	o := datalayer.Objective{Name: obj.Name}
	if obj.Spec.Priority != nil {
		o.Priority = *obj.Spec.Priority
	}
	for ann, into := range map[string]*time.Duration{AnnotationSLOTTFT: &o.TTFT, AnnotationSLOTPOT: &o.TPOT} {
		v, ok := obj.Annotations[ann]
		if !ok {
			continue
		}
		ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || !(ms > 0) || ms > 1e9 {
			// Bad input loses only itself: the objective keeps its priority.
			d.opts.Logger.Warn("InferenceObjective annotation is not a positive number of milliseconds; ignored",
				"objective", key.String(), "annotation", ann, "value", v)
			continue
		}
		*into = time.Duration(ms * float64(time.Millisecond))
	}
	d.opts.Objectives.Set(o)
	return nil
}
