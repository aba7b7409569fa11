package predict

import (
	"fmt"
	"math"
	"slices"
)

// Methods of learning, by the name a configuration gives.
const (
	// MethodEWLS is piecewise linear regression over the queue regimes,
	// fitted by exponentially weighted least squares with a ridge toward
	// the prior, its quantile from the recent residuals (a locally weighted
	// conformal bound). The default; docs/predictor.md says why.
	MethodEWLS = "ewls"
	// MethodQuantileSGD is online linear quantile regression: the mean and
	// the quantile each fitted by stochastic gradient descent (squared and
	// pinball loss) with per-coefficient step sizes (RMSProp).
	MethodQuantileSGD = "quantile-sgd"
)

// Methods lists the learning methods.
var Methods = []string{MethodEWLS, MethodQuantileSGD}

// floorMs bounds every prediction from below: no latency is shorter, and a
// coefficient fitted slightly wrong must not make one negative.
const floorMs = 0.05

// coefs are one target's coefficients as a prediction reads them, per
// regime: the mean's and the quantile's. Immutable once published (seal).
type coefs struct {
	mean, quant [NumRegimes]Vector
	// finite: every coefficient is finite, so that a feature that is zero
	// adds exactly nothing to a prediction and need not be multiplied.
	finite bool
}

// seal notes whether c's coefficients are all finite, and returns c.
func (c *coefs) seal() *coefs {
	c.finite = true
	for r := range NumRegimes {
		for i := range NumFeatures {
			if math.IsNaN(c.mean[r][i]) || math.IsInf(c.mean[r][i], 0) || math.IsNaN(c.quant[r][i]) || math.IsInf(c.quant[r][i], 0) {
				c.finite = false
			}
		}
	}
	return c
}

// predict is the mean and the quantile for x in regime r, never below the
// floor, never NaN; a quantile above the median is never below the mean.
// x's features from n on are zero.
func (c *coefs) predict(x *Vector, r int, tau float64, n int) (mean, q float64) {
	if !c.finite {
		n = NumFeatures
	}
	mean, q = dotN(&c.mean[r], x, n), dotN(&c.quant[r], x, n)
	if !(mean >= floorMs) { // NaN too
		mean = floorMs
	}
	if !(q >= floorMs) {
		q = floorMs
	}
	if tau >= 0.5 && q < mean {
		q = mean
	}
	if math.IsInf(mean, 0) || math.IsInf(q, 0) {
		// Only a model gone wrong gets here; a huge finite answer still
		// orders endpoints.
		mean, q = min(mean, math.MaxFloat32), min(q, math.MaxFloat32)
	}
	return mean, q
}

// predictMean is predict's mean alone, without the quantile's product.
func (c *coefs) predictMean(x *Vector, r int, tau float64, n int) float64 {
	if !c.finite {
		mean, _ := c.predict(x, r, tau, n)
		return mean
	}
	mean := dotN(&c.mean[r], x, n)
	if !(mean >= floorMs) {
		mean = floorMs
	}
	if mean > math.MaxFloat32 {
		// Bounded by the quantile's reading too: predict decides.
		mean, _ = c.predict(x, r, tau, n)
	}
	return mean
}

// learner learns one target (TTFT or TPOT) of one endpoint online.
type learner interface {
	// observe learns from y, the latency seen for features x in regime r.
	observe(x *Vector, r int, y float64)
	// coefs is what the learner predicts with now.
	coefs() *coefs
	// count is the observations learned in regime r.
	count(r int) int
	// clone is an independent copy (a new endpoint starting from what its
	// class has learned).
	clone() learner
}

// params tune the learners.
type params struct {
	tau float64
	// lambda is the forgetting factor per observation: the weight of one
	// observations ago. 1/(1-lambda) is the memory, in observations.
	lambda float64
	// ridge pulls each coefficient toward the prior with the weight of
	// that many observations.
	ridge float64
	// window is the recent residuals the quantile is read from.
	window int
	// relative fits for relative error rather than absolute (ewls): each
	// observation weighted by the inverse square of its latency.
	relative bool
}

func newLearner(method string, prior Vector, monotone [NumFeatures]bool, p params) (learner, error) {
	switch method {
	case MethodEWLS, "":
		return newEWLS(prior, monotone, p), nil
	case MethodQuantileSGD:
		return newQuantileSGD(prior, monotone, p), nil
	}
	return nil, fmt.Errorf("unknown learning method %q (known: %v)", method, Methods)
}

// ewls is piecewise linear least squares with exponential forgetting and a
// ridge toward the prior. Per regime it keeps the weighted Gram matrix A
// and moment b of what it saw, and solves (A + ρI)θ = b + ρθ₀ after every
// observation; a coefficient the observations do not excite stays at the
// prior instead of drifting. The quantile is the mean plus the τ-quantile
// of recent residuals, each normalised by (prediction + scale): latency's
// spread grows with latency, so one multiplier of that normalised width
// covers short and long predictions alike.
type ewls struct {
	p        params
	prior    Vector
	monotone [NumFeatures]bool
	a        [NumRegimes][NumFeatures][NumFeatures]float64
	b        [NumRegimes]Vector
	theta    [NumRegimes]Vector
	// held are the monotone coefficients theta holds at zero, per regime
	// (see constrained).
	held [NumRegimes][NumFeatures]bool
	n    [NumRegimes]int
	// res holds recent normalised residuals per regime, as a ring; scale
	// is the regime's recent mean absolute residual.
	res   [NumRegimes][]float64
	next  [NumRegimes]int
	scale [NumRegimes]float64
	// bias is a short moving average of the signed normalised residual:
	// it stays near zero while the model fits and leaves it when the
	// endpoint changes (see observe).
	bias   [NumRegimes]float64
	drifts int
	// typical is a moving average of the regime's latencies, kept by a
	// relative fit: an observation is weighted by its square over the
	// latency's, so that the fit minimises relative error (see observe).
	typical [NumRegimes]float64
	// k is the quantile's width multiplier per regime, read from res
	// every few observations; scratch is where res is sorted.
	k       [NumRegimes]float64
	scratch []float64
	out     *coefs
}

// Drift: when the recent residuals are on average more than driftBias of
// a width off in one direction, the endpoint has changed; what was
// learned before is then weighted down to driftKeep, so that the new
// behaviour is learned in tens of observations rather than a whole memory.
const (
	driftBias = 0.3
	driftKeep = 0.1
)

// Before any residual is seen, the quantile is this many widths above the
// mean.
const priorSpread = 0.5

// maxRelativeWeight bounds the weight a relative fit gives an
// observation far shorter than the regime's typical latency (one a tenth
// of it weighs a hundred times one at it), so that a handful of
// near-instant responses cannot outweigh the rest.
const maxRelativeWeight = 100

func newEWLS(prior Vector, monotone [NumFeatures]bool, p params) *ewls {
	l := &ewls{p: p, prior: prior, monotone: monotone}
	for r := range NumRegimes {
		l.theta[r] = prior
		l.scale[r] = math.Max(prior[0], 1)
		l.k[r] = priorSpread
	}
	l.publish()
	return l
}

func (l *ewls) count(r int) int { return l.n[r] }
func (l *ewls) coefs() *coefs   { return l.out }

func (l *ewls) clone() learner {
	c := *l
	for r := range NumRegimes {
		c.res[r] = slices.Clone(l.res[r])
	}
	c.scratch = nil
	c.publish()
	return &c
}

func (l *ewls) observe(x *Vector, r int, y float64) {
	if !(y >= 0) || math.IsInf(y, 0) {
		return
	}
	pred := dot(&l.theta[r], x)
	width := math.Max(pred, 0) + l.scale[r]
	if resid := (y - pred) / width; !math.IsNaN(resid) {
		if len(l.res[r]) < l.p.window {
			l.res[r] = append(l.res[r], resid)
		} else {
			l.res[r][l.next[r]] = resid
			l.next[r] = (l.next[r] + 1) % l.p.window
		}
	}
	l.scale[r] += (math.Abs(y-pred) - l.scale[r]) / 32
	l.scale[r] = math.Max(l.scale[r], floorMs)

	keep := l.p.lambda
	if l.n[r] >= 32 {
		l.bias[r] += (math.Max(-1, math.Min(1, (y-pred)/width)) - l.bias[r]) / 16
		if math.Abs(l.bias[r]) > driftBias {
			keep, l.bias[r] = driftKeep, 0
			l.drifts++
		}
	}
	w := 1.0
	if l.p.relative {
		if l.typical[r] == 0 {
			l.typical[r] = math.Max(y, floorMs)
		}
		l.typical[r] += (y - l.typical[r]) / 64
		w = l.typical[r] / math.Max(y, floorMs)
		w = math.Min(w*w, maxRelativeWeight)
	}
	a, b := &l.a[r], &l.b[r]
	for i := range NumFeatures {
		wx := w * x[i]
		b[i] = keep*b[i] + y*wx
		for j := range NumFeatures {
			a[i][j] = keep*a[i][j] + wx*x[j]
		}
	}
	l.n[r]++
	l.solve(r)
	if n := len(l.res[r]); n >= 16 && (n < l.p.window || l.n[r]%8 == 0) {
		l.scratch = append(l.scratch[:0], l.res[r]...)
		l.k[r] = quantileInPlace(l.scratch, l.p.tau)
	}
	l.publish()
}

// solve sets theta[r] to the least-squares solution of (A + ρI)θ = b + ρθ₀
// with every monotone coefficient at zero or above, by Cholesky solves
// over the coefficients left free (see constrained). A system that cannot
// be solved keeps the last coefficients.
func (l *ewls) solve(r int) {
	var m [NumFeatures]Vector
	var rhs Vector
	for i := range NumFeatures {
		for j := range NumFeatures {
			m[i][j] = l.a[r][i][j]
		}
		m[i][i] += l.p.ridge
		rhs[i] = l.b[r][i] + l.p.ridge*l.prior[i]
	}
	theta, ok := constrained(&m, &rhs, &l.monotone, &l.held[r])
	if !ok {
		return
	}
	for _, v := range theta {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
	}
	l.theta[r] = theta
}

// constrainedRounds bounds constrained's changes to the set of
// coefficients held at zero; each costs one Cholesky solve.
const constrainedRounds = 2 * NumFeatures

// constrained is the θ minimising ½θᵀMθ − θᵀrhs with θ_i ≥ 0 for every
// monotone i (M symmetric positive definite, so that the minimum is
// unique), by an active set: solve with the coefficients in held at zero
// and the rest free; hold at zero the monotone ones that came out
// negative and solve again; release a held one whose gradient says it
// would rise, the steepest first; stop when every free one is feasible
// and no held one would rise (the optimum's conditions). held starts as
// the last observation's set, which one more observation seldom changes,
// and is left as this one's: a change of the set is one solve of at most
// NumFeatures unknowns (a few µs), and the set is usually settled at the
// first. Should the rounds run out first, the monotone coefficients still
// negative are clipped, so that the answer is always feasible. It
// reports false when M is not positive definite over the free
// coefficients.
func constrained(m *[NumFeatures]Vector, rhs *Vector, monotone, held *[NumFeatures]bool) (Vector, bool) {
	for i := range held {
		held[i] = held[i] && monotone[i]
	}
	theta, ok := solveFree(m, rhs, held)
	for round := 0; ok && round < constrainedRounds; round++ {
		changed := false
		for i, v := range theta {
			if monotone[i] && !held[i] && v < 0 {
				held[i], changed = true, true
			}
		}
		if !changed {
			// Feasible: release the held coefficient whose gradient
			// (rhs − Mθ)_i is the most positive, if any is.
			release, steepest := -1, 0.0
			for i := range NumFeatures {
				if !held[i] {
					continue
				}
				g := rhs[i] - dot(&m[i], &theta)
				if g > steepest*(1+1e-12) && g > 1e-12*(math.Abs(rhs[i])+1) {
					release, steepest = i, g
				}
			}
			if release < 0 {
				return theta, true
			}
			held[release] = false
		}
		theta, ok = solveFree(m, rhs, held)
	}
	if !ok {
		return Vector{}, false
	}
	for i := range theta {
		if monotone[i] && theta[i] < 0 {
			theta[i] = 0
		}
	}
	return theta, true
}

// solveFree solves Mθ = rhs over the coefficients not held, the held ones
// at zero, by a Cholesky factorisation of M's free rows and columns.
func solveFree(m *[NumFeatures]Vector, rhs *Vector, held *[NumFeatures]bool) (Vector, bool) {
	var idx [NumFeatures]int
	n := 0
	for i := range NumFeatures {
		if !held[i] {
			idx[n] = i
			n++
		}
	}
	// c = L·Lᵀ over the free coefficients, in its lower triangle; inv
	// holds L's diagonal's reciprocals.
	var c [NumFeatures]Vector
	var inv [NumFeatures]float64
	for a := range n {
		for b := range a + 1 {
			c[a][b] = m[idx[a]][idx[b]]
		}
	}
	for j := range n {
		d := c[j][j] - dotN(&c[j], &c[j], j)
		if !(d > 0) {
			return Vector{}, false
		}
		c[j][j] = math.Sqrt(d)
		inv[j] = 1 / c[j][j]
		for i := j + 1; i < n; i++ {
			c[i][j] = (c[i][j] - dotN(&c[i], &c[j], j)) * inv[j]
		}
	}
	var z, x Vector
	for i := range n {
		z[i] = (rhs[idx[i]] - dotN(&c[i], &z, i)) * inv[i]
	}
	for i := n - 1; i >= 0; i-- {
		s := z[i]
		for k := i + 1; k < n; k++ {
			s -= c[k][i] * x[k]
		}
		x[i] = s * inv[i]
	}
	var theta Vector
	for i := range n {
		theta[idx[i]] = x[i]
	}
	return theta, true
}

func (l *ewls) publish() {
	c := &coefs{mean: l.theta}
	for r := range NumRegimes {
		k := l.k[r]
		// q = pred + k·(pred + scale)
		q := l.theta[r]
		for i := range q {
			q[i] *= 1 + k
		}
		q[0] += k * l.scale[r]
		c.quant[r] = q
	}
	l.out = c.seal()
}

// quantileInPlace is the τ-quantile of xs, which it reorders.
func quantileInPlace(xs []float64, tau float64) float64 {
	slices.Sort(xs)
	i := int(math.Ceil(tau*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// quantileSGD fits the mean by squared loss and the quantile by pinball
// loss, each by stochastic gradient descent with per-coefficient step
// sizes scaled by the recent gradients (RMSProp, whose memory is the
// predictor's), starting from the prior.
type quantileSGD struct {
	p           params
	monotone    [NumFeatures]bool
	mean, quant [NumRegimes]Vector
	gm, gq      [NumRegimes]Vector
	n           [NumRegimes]int
	out         *coefs
}

// sgdRate is the step, in milliseconds per unit of feature, that the
// recent gradients' size scales.
const sgdRate = 4

func newQuantileSGD(prior Vector, monotone [NumFeatures]bool, p params) *quantileSGD {
	l := &quantileSGD{p: p, monotone: monotone}
	for r := range NumRegimes {
		l.mean[r] = prior
		l.quant[r] = prior
		l.quant[r][0] += priorSpread * math.Max(prior[0], 1)
	}
	l.publish()
	return l
}

func (l *quantileSGD) count(r int) int { return l.n[r] }
func (l *quantileSGD) coefs() *coefs   { return l.out }

func (l *quantileSGD) clone() learner {
	c := *l
	c.publish()
	return &c
}

func (l *quantileSGD) observe(x *Vector, r int, y float64) {
	if !(y >= 0) || math.IsInf(y, 0) {
		return
	}
	em := dot(&l.mean[r], x) - y
	q := dot(&l.quant[r], x)
	gq := -l.p.tau
	if y < q {
		gq = 1 - l.p.tau
	}
	// The squared loss's gradient is clipped to a unit-free sign times the
	// error's size relative to y, so that one outlier does not throw the
	// mean off by its whole size.
	gm := math.Max(-1, math.Min(1, em/math.Max(y, 1)))
	for i := range NumFeatures {
		if x[i] == 0 {
			continue
		}
		g := gm * x[i]
		l.gm[r][i] = l.p.lambda*l.gm[r][i] + g*g
		l.mean[r][i] -= sgdRate * g / math.Sqrt(l.gm[r][i]+1e-9)
		g = gq * x[i]
		l.gq[r][i] = l.p.lambda*l.gq[r][i] + g*g
		l.quant[r][i] -= sgdRate * g / math.Sqrt(l.gq[r][i]+1e-9)
		if l.monotone[i] {
			l.mean[r][i], l.quant[r][i] = max(l.mean[r][i], 0), max(l.quant[r][i], 0)
		}
	}
	l.n[r]++
	l.publish()
}

func (l *quantileSGD) publish() {
	l.out = (&coefs{mean: l.mean, quant: l.quant}).seal()
}
