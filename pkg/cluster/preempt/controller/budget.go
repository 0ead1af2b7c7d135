package controller

import (
	"math"
	"time"

	"golang.org/x/time/rate"
)

// budget caps the evictions of the whole preemptor (--max-evictions-per-
// minute): a token bucket that holds a minute's worth and refills at that
// rate, so a burst of up to perMinute evictions goes at once and the long-
// run rate never exceeds perMinute a minute. What it guards against is a
// wrong decision (a bad gate, a bug, a flood of urgent pods) repeated at
// the speed of the API server. A nil *budget is no cap.
type budget struct {
	lim       *rate.Limiter
	perMinute int
}

func newBudget(perMinute int) *budget {
	if perMinute <= 0 {
		return nil
	}
	return &budget{lim: rate.NewLimiter(rate.Limit(float64(perMinute)/60), perMinute), perMinute: perMinute}
}

// fits reports whether n evictions can ever go at once: not where they
// are more than the bucket holds.
func (b *budget) fits(n int) bool {
	return b == nil || n <= b.perMinute
}

// wait is how long until n evictions are in the budget at now: 0 where
// they are now. It takes nothing.
func (b *budget) wait(now time.Time, n int) time.Duration {
	if b == nil {
		return 0
	}
	short := float64(n) - b.lim.TokensAt(now)
	if short <= 0 {
		return 0
	}
	// Rounded up to a whole second: waking a little late costs nothing,
	// a little early costs a second look.
	return time.Duration(math.Ceil(short/float64(b.lim.Limit()))) * time.Second
}

// take takes n evictions from the budget at now, all or none: a
// preemption half carried out frees too little and costs its victims all
// the same.
func (b *budget) take(now time.Time, n int) bool {
	return b == nil || b.lim.AllowN(now, n)
}
