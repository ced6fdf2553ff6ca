package admin

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/httpserve"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/*
var staticFS embed.FS

// pages are the console's templates, each parsed with the layout.
var pages = func() map[string]*template.Template {
	funcs := template.FuncMap{
		"age":         func(d time.Duration) string { return roundAge(d) },
		"since":       func(t time.Time) string { return roundAge(time.Since(t)) },
		"until":       untilText,
		"when":        func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000 UTC") },
		"money":       money,
		"keyhash":     func(c chargeonce.Charge) string { return idempotency.KeyHash(c.MerchantID, c.IdempotencyKey) },
		"urlpath":     url.PathEscape,
		"isstatus":    func(c chargeonce.Charge, s string) bool { return string(c.Status) == s },
		"human":       Human,
		"collapse":    Collapse,
		"clock":       func(t time.Time) string { return t.UTC().Format("15:04:05") },
		"isrefund":    func(id string) bool { return kindOf(id) == chargeonce.KindRefund },
		"isoperation": isOperation,
		"kind":        kindName,
	}
	out := map[string]*template.Template{}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		panic(err)
	}
	for _, n := range names {
		if n == "templates/layout.html" {
			continue
		}
		t := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n))
		out[strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")] = t
	}
	return out
}()

func roundAge(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}

func untilText(t time.Time) string {
	d := time.Until(t)
	if d <= 0 {
		return "due now"
	}
	return "in " + roundAge(d)
}

// money shows an amount in the currency's minor unit (ISO 4217): 1000 JPY
// is "1,000 JPY", 1000 KWD "1.000 KWD".
func money(minor int64, currency string) string { return chargeonce.FormatAmount(minor, currency) }

// consoleRoutes mounts the web console.
func (s *Server) consoleRoutes(m *http.ServeMux) {
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err)
	}
	m.Handle("GET /admin/static/", http.StripPrefix("/admin/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /admin/{$}", s.page(s.stuckPage))
	m.HandleFunc("GET /admin/login", s.loginPage)
	m.HandleFunc("POST /admin/login", s.login)
	m.HandleFunc("POST /admin/logout", s.page(s.logout))
	m.HandleFunc("POST /admin/search", s.page(s.search))
	m.HandleFunc("GET /admin/charges/{id}", s.page(s.chargePage))
	m.HandleFunc("POST /admin/charges/{id}/lookup", s.page(s.lookPage))
	m.HandleFunc("POST /admin/bulk", s.page(s.bulkSettle))
	m.HandleFunc("POST /admin/charges/{id}/resolve", s.page(s.resolveForm))
	m.HandleFunc("GET /admin/audit", s.page(s.auditPage))
	m.HandleFunc("GET /admin/refunds/{id}", s.page(s.refundPage))
	m.HandleFunc("POST /admin/refunds/{id}/lookup", s.page(s.refundLookPage))
	m.HandleFunc("POST /admin/refunds/{id}/resolve", s.page(s.refundResolveForm))
	m.HandleFunc("GET /admin/operations/{id}", s.page(s.operationPage))
	m.HandleFunc("POST /admin/operations/{id}/lookup", s.page(s.operationLookPage))
	m.HandleFunc("POST /admin/operations/{id}/resolve", s.page(s.operationResolveForm))
	s.reconRoutes(m)
	m.HandleFunc("GET /admin", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/admin/", http.StatusSeeOther)
	})
}

// pageHandler renders a console page for a signed-in admin.
type pageHandler func(w http.ResponseWriter, r *http.Request, ss *session) error

// view is what every page's template gets.
type view struct {
	Title string
	Admin string
	CSRF  string
	Error string
	Data  any
}

// securityHeaders go on every console answer: no caching (pages show
// charges), no framing, no script at all, no referrer leaving the site.
func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// page checks the session (and, on a POST, the CSRF token and the origin),
// logs the call with the admin's name, and renders errors as a page.
func (s *Server) page(h pageHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		securityHeaders(w)
		ss, ok := s.sessions.get(r)
		if !ok {
			s.logCall(r, "", http.StatusSeeOther, start, nil)
			http.Redirect(w, r, "/admin/login", http.StatusSeeOther)
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxBody)
			if !s.sameOrigin(r) || !ss.csrfOK(r) {
				s.logCall(r, ss.admin, http.StatusForbidden, start, nil)
				http.Error(w, "This form is stale or did not come from this console: go back, reload the page and try again.", http.StatusForbidden)
				return
			}
		}
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		err := h(rec, r, ss)
		if err != nil {
			status, _ := writeProblemStatus(err)
			rec.status = status
			s.render(w, r, status, "error", view{Title: "Error", Admin: ss.admin, CSRF: ss.csrf, Error: chargeonce.ErrorMessage(err)})
		}
		s.logCall(r, ss.admin, rec.status, start, err)
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// writeProblemStatus is the status an error is shown with.
func writeProblemStatus(err error) (int, string) {
	var b bytes.Buffer
	status := writeProblem(&discard{h: http.Header{}, b: &b}, err)
	return status, b.String()
}

type discard struct {
	h http.Header
	b *bytes.Buffer
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return d.b.Write(p) }
func (d *discard) WriteHeader(int)             {}

// render executes a page into a buffer first, so that a template error
// is a 500, not half a page.
func (s *Server) render(w http.ResponseWriter, _ *http.Request, status int, name string, v view) {
	t, ok := pages[name]
	if !ok {
		http.Error(w, "no such page", http.StatusInternalServerError)
		return
	}
	var b bytes.Buffer
	if err := t.Execute(&b, v); err != nil {
		s.log.Error("rendering a console page failed", "page", name, "err", err)
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w)
	if _, ok := s.sessions.get(r); ok {
		http.Redirect(w, r, "/admin/", http.StatusSeeOther)
		return
	}
	s.render(w, r, http.StatusOK, "login", view{Title: "Sign in"})
}

// login exchanges an admin key (posted, never in a URL) for a session
// cookie. The key is not kept, logged or shown back.
//
// The key is always checked, and a right one always accepted: wrong keys,
// and only they, are counted, and past the budgets answered 429. A form
// is read within SignInFormBytes and SignInReadTimeout, at most
// SignInsPerAddress at once from one address: forms trickled in from
// many addresses hold their own addresses' slots, never an operator's.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	securityHeaders(w)
	addr := s.clientAddr(r)
	release, ok := s.guard.signIn(addr)
	if !ok {
		s.refuseSignIn(w, r, start, time.Second, "Too many sign-in forms from your address at once: the key was not read.")
		return
	}
	defer release()
	if !s.sameOrigin(r) {
		s.logCall(r, "", http.StatusForbidden, start, nil)
		http.Error(w, "cross-site sign-in refused", http.StatusForbidden)
		return
	}
	key, err := readSignInForm(w, r)
	if err != nil {
		w.Header().Set("Connection", "close")
		s.logCall(r, "", http.StatusBadRequest, start, nil)
		s.render(w, r, http.StatusBadRequest, "login", view{Title: "Sign in", Error: "The sign-in form did not arrive whole: try again."})
		return
	}
	admin, ok := s.keys.lookup(key, r.Host)
	if !ok {
		if throttled, wait := s.guard.failed(addr); throttled {
			s.refuseSignIn(w, r, start, wait, "That is not an admin key, and there have been too many wrong ones from your address (or from everywhere).")
			return
		}
		msg := "That is not an admin key. Merchants' API keys do not work here."
		if s.keys.loopbackHosts && !httpserve.LoopbackHost(r.Host) {
			msg = "The demo admin key signs in only at localhost, 127.0.0.1 or [::1]."
		}
		s.logCall(r, "", http.StatusUnauthorized, start, nil)
		s.render(w, r, http.StatusUnauthorized, "login", view{Title: "Sign in", Error: msg})
		return
	}
	id, _ := s.sessions.create(admin)
	// Secure whenever the operator's browser speaks HTTPS (a TLS listener,
	// or a trusted proxy that terminates TLS); a loopback console over
	// plain HTTP (the default) could not keep a Secure cookie.
	http.SetCookie(w, &http.Cookie{ //nolint:gosec // G124: Secure follows s.secure, see above
		Name: sessionCookie, Value: id, Path: "/admin/", HttpOnly: true, Secure: s.secure(r),
		SameSite: http.SameSiteStrictMode, MaxAge: int(s.cfg.SessionTTL.Seconds()),
	})
	s.logCall(r, admin, http.StatusSeeOther, start, nil)
	http.Redirect(w, r, "/admin/", http.StatusSeeOther)
}

// readSignInForm reads a sign-in form's key: at most SignInFormBytes,
// within SignInReadTimeout of its headers.
func readSignInForm(w http.ResponseWriter, r *http.Request) (string, error) {
	if r.ContentLength > SignInFormBytes {
		return "", errors.New("sign-in form too large")
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(SignInReadTimeout))
	r.Body = http.MaxBytesReader(w, r.Body, SignInFormBytes)
	if err := r.ParseForm(); err != nil {
		return "", err
	}
	return strings.TrimSpace(r.PostForm.Get("key")), nil
}

// refuseSignIn answers a sign-in 429 with why, and when to come back.
func (s *Server) refuseSignIn(w http.ResponseWriter, r *http.Request, start time.Time, wait time.Duration, why string) {
	secs := int(max(wait, time.Second).Round(time.Second).Seconds())
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	s.logCall(r, "", http.StatusTooManyRequests, start, nil)
	s.render(w, r, http.StatusTooManyRequests, "login", view{Title: "Sign in",
		Error: fmt.Sprintf("%s Try again in %d s.", why, secs)})
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, _ *session) error {
	s.sessions.end(r)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/admin/", MaxAge: -1, HttpOnly: true, Secure: s.secure(r), SameSite: http.SameSiteStrictMode}) //nolint:gosec // G124: Secure follows s.secure, as at login
	http.Redirect(w, r, "/admin/login", http.StatusSeeOther)
	return nil
}

// stuckView is the stuck list page's data.
type stuckView struct {
	Groups    []Group
	Charges   []chargeonce.StuckCharge
	HasMore   bool
	Next      string
	Merchant  string
	OlderThan string
	// IncludeLeased is set when the list shows the charges driven under
	// a live lease too; Toggle is the link that flips it.
	IncludeLeased bool
	Toggle        string
}

func (s *Server) stuckPage(w http.ResponseWriter, r *http.Request, ss *session) error {
	p, err := stuckParams(r)
	if err != nil {
		return err
	}
	page, err := s.ops.ChargesListStuck(r.Context(), p)
	if err != nil {
		return err
	}
	d := stuckView{Groups: Groups(page.Charges), Charges: page.Charges, HasMore: page.HasMore, Merchant: p.MerchantID,
		OlderThan: r.URL.Query().Get("older_than"), IncludeLeased: p.IncludeLeased}
	filters := func(includeLeased bool) url.Values {
		q := url.Values{}
		if d.Merchant != "" {
			q.Set("merchant", d.Merchant)
		}
		if d.OlderThan != "" {
			q.Set("older_than", d.OlderThan)
		}
		if includeLeased {
			q.Set("include_leased", "1")
		}
		return q
	}
	d.Toggle = "/admin/?" + filters(!p.IncludeLeased).Encode()
	if page.HasMore {
		q := filters(p.IncludeLeased)
		// The last row's own id (a refund's, a capture's…): its charge's
		// would place the cursor before the row, and show it again.
		q.Set("after", page.Charges[len(page.Charges)-1].ObjectID())
		d.Next = "/admin/?" + q.Encode()
	}
	s.render(w, r, http.StatusOK, "stuck", view{Title: "Stuck charges", Admin: ss.admin, CSRF: ss.csrf, Data: d})
	return nil
}

// searchView lists the charges a search found.
type searchView struct {
	What    string
	Charges []chargeonce.Charge
}

// search finds charges by id (or a capture or cancel by its id), by
// merchant and order id, or by merchant and idempotency key. It is a POST
// so that a key never lands in a URL, a browser's history or an access
// log; the key is looked up, and only its hash is ever shown.
func (s *Server) search(w http.ResponseWriter, r *http.Request, ss *session) error {
	id := strings.TrimSpace(r.PostFormValue("charge_id"))
	merchant := strings.TrimSpace(r.PostFormValue("merchant"))
	order := strings.TrimSpace(r.PostFormValue("order_id"))
	key := r.PostFormValue("idempotency_key")
	ctx := r.Context()
	switch {
	case id != "" && isOperation(id):
		// A capture's or a cancel's id finds its own page.
		if _, err := s.ops.OperationInspect(ctx, id); err != nil {
			return err
		}
		http.Redirect(w, r, "/admin/operations/"+url.PathEscape(id), http.StatusSeeOther)
		return nil
	case id != "":
		if _, err := s.ops.ChargeInspect(ctx, id); err != nil {
			return err
		}
		http.Redirect(w, r, "/admin/charges/"+url.PathEscape(id), http.StatusSeeOther)
		return nil
	case merchant == "":
		return chargeonce.FieldError("merchant", "give a charge id, or a merchant with an order id or an idempotency key")
	case key != "":
		rec, err := s.store.KeyGet(ctx, merchant, key)
		if err != nil {
			if chargeonce.ErrorCode(err) == chargeonce.ENOTFOUND {
				return chargeonce.Errorf(chargeonce.ENOTFOUND, "merchant %s holds no record under the idempotency key with hash %s (records are kept until their TTL ends after settlement)",
					merchant, idempotency.KeyHash(merchant, key))
			}
			return err
		}
		http.Redirect(w, r, "/admin/charges/"+url.PathEscape(rec.Charge.ID), http.StatusSeeOther)
		return nil
	case order != "":
		n, err := strconv.ParseInt(order, 10, 64)
		if err != nil || n <= 0 {
			return chargeonce.FieldError("order_id", "order_id must be a positive whole number")
		}
		cs, err := s.store.ChargesListByOrder(ctx, merchant, n)
		if err != nil {
			return err
		}
		if len(cs) == 1 {
			http.Redirect(w, r, "/admin/charges/"+url.PathEscape(cs[0].ID), http.StatusSeeOther)
			return nil
		}
		s.render(w, r, http.StatusOK, "search", view{Title: "Search", Admin: ss.admin, CSRF: ss.csrf,
			Data: searchView{What: fmt.Sprintf("merchant %s, order %d", merchant, n), Charges: cs}})
		return nil
	default:
		return chargeonce.FieldError("order_id", "give an order id or an idempotency key with the merchant")
	}
}

// chargeView is a charge's page.
type chargeView struct {
	In       chargeonce.ChargeInspection
	Timeline []chargeonce.HistoryEntry
	Form     ResolveRequest
	// Refunds are the charge's refunds, newest first; a pending one can
	// be looked up and resolved from here.
	Refunds []chargeonce.Refund
	// Operations are the capture or cancel holding an authorization, each
	// linked to its own page.
	Operations []chargeonce.Operation
}

func (s *Server) chargePage(w http.ResponseWriter, r *http.Request, ss *session) error {
	in, tl, err := s.detail(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	refunds, err := s.chargeRefunds(r.Context(), in.Charge)
	if err != nil {
		return err
	}
	var ops []chargeonce.Operation
	if st := in.Charge.Status; st == chargeonce.StatusAuthorized || st == chargeonce.StatusCaptured || st == chargeonce.StatusCanceled {
		if ops, err = s.ops.ChargeOperations(r.Context(), in.Charge.ID); err != nil {
			return err
		}
	}
	s.render(w, r, http.StatusOK, "charge", view{Title: "Charge " + in.Charge.ID, Admin: ss.admin, CSRF: ss.csrf,
		Data: chargeView{In: in, Timeline: tl, Refunds: refunds, Operations: ops}})
	return nil
}

// confirmView is the confirmation step of a resolution.
type confirmView struct {
	In             chargeonce.ChargeInspection
	Form           ResolveRequest
	Acquirer       AcquirerView
	AcquirerAnswer string
	Disagrees      bool
}

// resolveForm is the resolve form's two steps: without confirm it shows
// what will happen and asks again; with confirm it resolves. A refusal
// because the acquirer disagrees, or could not say what happened, comes back
// to the confirmation, which then offers to force.
func (s *Server) resolveForm(w http.ResponseWriter, r *http.Request, ss *session) error {
	id := r.PathValue("id")
	q := ResolveRequest{
		Status:      chargeonce.Status(r.PostFormValue("status")),
		DeclineCode: strings.TrimSpace(r.PostFormValue("decline_code")),
		Reason:      strings.TrimSpace(r.PostFormValue("reason")),
		Force:       r.PostFormValue("force") == "1",
	}
	in, err := s.ops.ChargeInspect(r.Context(), id)
	if err != nil {
		return err
	}
	if err := q.Check(); err != nil {
		return err
	}
	if in.Charge.Status != chargeonce.StatusProcessing {
		return chargeonce.Errorf(chargeonce.ENOTPROCESSING, "charge %s is %s already; nothing to resolve", id, in.Charge.Status)
	}
	if r.PostFormValue("confirm") != "1" {
		// Look again: the answer may have changed since the operator read it.
		s.render(w, r, http.StatusOK, "confirm", view{Title: "Confirm resolution", Admin: ss.admin, CSRF: ss.csrf,
			Data: confirmView{In: in, Form: q, Acquirer: s.lookUp(r.Context(), in.Charge)}})
		return nil
	}
	res, err := s.Resolve(r.Context(), ss.admin, id, q)
	if code := chargeonce.ErrorCode(err); code == chargeonce.EDISAGREES || code == chargeonce.EUNSURE {
		title := "The acquirer disagrees"
		if code == chargeonce.EUNSURE {
			title = "The acquirer could not say what happened"
		}
		s.render(w, r, http.StatusConflict, "confirm", view{Title: title, Admin: ss.admin, CSRF: ss.csrf,
			Error: chargeonce.ErrorMessage(err), Data: confirmView{In: in, Form: q, AcquirerAnswer: res.AcquirerAnswer, Disagrees: true,
				Acquirer: s.lookUp(r.Context(), in.Charge)}})
		return nil
	}
	if err != nil {
		return err
	}
	// Post/redirect/get: reloading the charge's page resolves nothing
	// again. The page shows the resolution from the audit trail, not from
	// anything in the URL.
	_ = res
	http.Redirect(w, r, "/admin/charges/"+url.PathEscape(id), http.StatusSeeOther)
	return nil
}

func (s *Server) auditPage(w http.ResponseWriter, r *http.Request, ss *session) error {
	p, err := auditParams(r)
	if err != nil {
		return err
	}
	es, err := s.ops.AuditList(r.Context(), p)
	if err != nil {
		return err
	}
	next := ""
	if len(es) == p.Limit {
		next = "/admin/audit?before=" + strconv.FormatInt(es[len(es)-1].ID, 10)
	}
	s.render(w, r, http.StatusOK, "audit", view{Title: "Audit trail", Admin: ss.admin, CSRF: ss.csrf,
		Data: struct {
			Entries []chargeonce.HistoryEntry
			Next    string
		}{es, next}})
	return nil
}
