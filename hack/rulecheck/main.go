// rulecheck: the two rule commands of Prometheus's promtool, built from the pinned Prometheus
// module without the rest of promtool (whose service discovery pulls every cloud SDK).
//
//	rulecheck check FILE...   like `promtool check rules`: rulefmt.ParseFile (the YAML, every
//	                          expression parsed, every label and annotation template checked),
//	                          then duplicate rules, which are an error here (promtool only warns).
//	rulecheck test FILE...    `promtool test rules`: promtool's own unittest.go, copied into the
//	                          build from the same module by hack/build-rulecheck.sh.
//	rulecheck names FILE...   the metric name of every selector in every rule's expression, read
//	                          by Prometheus's parser: one JSON object a rule, {"rule": ..., "names": [...]}
//	                          ("" for a selector without a name).
//
// Exit 0 when every file passes, 1 otherwise.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"

	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

// promtool's exit codes (cmd/promtool/main.go); unittest.go uses the first two.
const (
	successExitCode = 0
	failureExitCode = 1
)

func init() {
	// As promtool does: metric and label names may be any UTF-8.
	//nolint:staticcheck
	model.NameValidationScheme = model.UTF8Validation
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: rulecheck check|test|names FILE...")
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{}) // promtool's parser, no --enable-feature
	files := os.Args[2:]
	switch os.Args[1] {
	case "check":
		os.Exit(check(p, files))
	case "names":
		os.Exit(names(p, files))
	case "test":
	default:
		fmt.Fprintln(os.Stderr, "usage: rulecheck check|test|names FILE...")
		os.Exit(2)
	}
	// promtool test rules' defaults: no --run filter, no --diff, no --debug, unknown fields refused.
	os.Exit(RulesUnitTestResult(io.Discard,
		promqltest.LazyLoaderOpts{EnableAtModifier: true, EnableNegativeOffset: true},
		p, nil, false, false, false, files...))
}

func check(p parser.Parser, files []string) int {
	logger := promslog.New(&promslog.Config{})
	code := successExitCode
	for _, f := range files {
		fmt.Println("Checking", f)
		groups, errs := rulefmt.ParseFile(f, false, model.UTF8Validation, p, logger)
		if errs == nil {
			if dup := duplicates(groups.Groups); dup != "" {
				errs = []error{fmt.Errorf("duplicate rules: %s", dup)}
			}
		}
		if errs != nil {
			code = failureExitCode
			fmt.Fprintln(os.Stderr, "  FAILED:")
			for _, e := range errs {
				fmt.Fprintln(os.Stderr, e.Error())
			}
			continue
		}
		n := 0
		for _, g := range groups.Groups {
			n += len(g.Rules)
		}
		fmt.Printf("  SUCCESS: %d rules found\n", n)
	}
	return code
}

func names(p parser.Parser, files []string) int {
	logger := promslog.New(&promslog.Config{})
	out := json.NewEncoder(os.Stdout)
	for _, f := range files {
		groups, errs := rulefmt.ParseFile(f, false, model.UTF8Validation, p, logger)
		if errs != nil {
			for _, e := range errs {
				fmt.Fprintln(os.Stderr, e.Error())
			}
			return failureExitCode
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				expr, err := p.ParseExpr(r.Expr)
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					return failureExitCode
				}
				found := []string{}
				parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
					if selector, ok := node.(*parser.VectorSelector); ok {
						found = append(found, selector.Name)
					}
					return nil
				})
				rule := r.Alert
				if rule == "" {
					rule = r.Record
				}
				if err := out.Encode(map[string]any{"rule": rule, "names": found}); err != nil {
					return failureExitCode
				}
			}
		}
	}
	return successExitCode
}

// duplicates names the rules of the same name and labels (promtool's checkDuplicates).
func duplicates(groups []rulefmt.RuleGroup) string {
	seen := map[string]bool{}
	var found []string
	for _, g := range groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			key := name + rules.FromMaps(g.Labels, r.Labels).String()
			if seen[key] {
				found = append(found, key)
			}
			seen[key] = true
		}
	}
	sort.Strings(found)
	return strings.Join(found, ", ")
}

// parseTime is promtool's (cmd/promtool/query.go): unittest.go reads start_timestamp with it.
func parseTime(s string) (time.Time, error) {
	if t, err := strconv.ParseFloat(s, 64); err == nil {
		s, ns := math.Modf(t)
		return time.Unix(int64(s), int64(ns*float64(time.Second))).UTC(), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("cannot parse %q to a valid timestamp", s)
}
