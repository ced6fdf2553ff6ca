package postgres

import (
	"context"
	"slices"
	"strings"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// tracerScope is the instrumentation scope of the store's own spans (the
// batches); pgx's statements are traced under otelpgx's.
const tracerScope = "github.com/chargeonce/chargeonce/postgres"

// WithTracerProvider traces the store with tp: every statement, batch and
// connection acquisition gets a span (github.com/exaring/otelpgx) under the
// span of the call that sent it, and every batch of concurrent attempts
// (batch.go) a span linked to each attempt's. Without this option, or with a
// nil tp, the store installs no tracer at all and pays nothing for one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// applyTracing installs the pgx tracer on cfg when tracing is asked for.
func (o *options) applyTracing(cfg *pgxpool.Config) {
	if o.tracerProvider == nil {
		return
	}
	cfg.ConnConfig.Tracer = otelpgx.NewTracer(
		otelpgx.WithTracerProvider(o.tracerProvider),
		// A statement's text, never its arguments: those hold merchants'
		// idempotency keys and stored answers.
		otelpgx.WithSpanNameFunc(statementName),
	)
}

// statementName names a statement's span by what it does: the verbs that
// change rows, in the order they appear ("DELETE+INSERT" for KeyInsert,
// which clears an expired record in the same statement), or the first
// word (SELECT). The store's statements are data-modifying CTEs, whose
// first word, WITH, says nothing.
func statementName(sql string) string {
	upper := strings.ToUpper(sql)
	type at struct {
		verb string
		pos  int
	}
	var found []at
	for _, verb := range []string{"INSERT ", "UPDATE ", "DELETE "} {
		if i := strings.Index(upper, verb); i >= 0 {
			found = append(found, at{strings.TrimSpace(verb), i})
		}
	}
	if len(found) == 0 {
		first, _, _ := strings.Cut(strings.TrimSpace(upper), " ")
		return first
	}
	slices.SortFunc(found, func(a, b at) int { return a.pos - b.pos })
	names := make([]string, len(found))
	for i, f := range found {
		names[i] = f.verb
	}
	return strings.Join(names, "+")
}

// batchTracer is the tracer of the store's batches, or nil when tracing is
// off.
func (o *options) batchTracer() trace.Tracer {
	if o.tracerProvider == nil {
		return nil
	}
	return o.tracerProvider.Tracer(tracerScope)
}

// startBatchSpan starts the span of a batch of two or more jobs, on ctx
// (the batch's context, which carries its first job's span), linked to the
// span of every job in it, and links every job's span back to it: each
// attempt's trace shows which batch carried its statement, and the batch
// shows every attempt it carried. It returns ctx unchanged and a nil span
// when b has no tracer.
func (b *batcher) startBatchSpan(ctx context.Context, batch []job) (context.Context, trace.Span) {
	if b.tracer == nil {
		return ctx, nil
	}
	links := make([]trace.Link, 0, len(batch))
	inserts := 0
	for _, j := range batch {
		switch j.(type) {
		case *insertJob, *refundInsertJob:
			inserts++
		}
		if sc := trace.SpanContextFromContext(j.pending().ctx); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := b.tracer.Start(ctx, "postgres.batch", trace.WithSpanKind(trace.SpanKindInternal), trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.Int("chargeonce.batch.size", len(batch)),
			attribute.Int("chargeonce.batch.inserts", inserts),
			attribute.Int("chargeonce.batch.completions", len(batch)-inserts),
		))
	link := trace.Link{SpanContext: span.SpanContext()}
	for _, j := range batch {
		trace.SpanFromContext(j.pending().ctx).AddLink(link)
	}
	return ctx, span
}
