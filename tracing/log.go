package tracing

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Log attributes naming the span a log line was written in.
const (
	LogTraceID = "trace_id"
	LogSpanID  = "span_id"
)

// Logger returns log with every line written in a span (through a Context
// method: InfoContext, LogAttrs) carrying that span's trace_id and span_id,
// so a log line leads to its trace and a trace to its log lines. Returns log
// itself when t is nil.
func (t *Tracing) Logger(log *slog.Logger) *slog.Logger {
	if t == nil || log == nil {
		return log
	}
	return slog.New(LogHandler(log.Handler()))
}

// LogHandler wraps h so that records logged with a context holding a valid
// span carry its trace_id and span_id.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ next slog.Handler }

func (h logHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String(LogTraceID, sc.TraceID().String()), slog.String(LogSpanID, sc.SpanID().String()))
	}
	return h.next.Handle(ctx, r)
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler { return logHandler{h.next.WithAttrs(as)} }

func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.next.WithGroup(name)} }
