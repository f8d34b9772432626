// Package dockerfile reads a Dockerfile into its stages and instructions, so
// that tests can check what each image target holds without a Docker daemon.
//
// It reads what BuildKit's Dockerfile frontend reads for the instructions our
// Dockerfile uses: parser directives (escape), comments, line continuations,
// flags (--from, --mount, ...), JSON ("exec") and shell forms, ARG defaults and
// ${VAR} in FROM. It refuses what it does not understand (heredocs) rather than
// guess, so a Dockerfile that outgrows it fails the tests loudly.
package dockerfile

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// Instruction is one instruction of a Dockerfile.
type Instruction struct {
	// Cmd is the instruction's keyword in lower case: "from", "run", "copy", ...
	Cmd string
	// Flags are the --name=value flags that follow the keyword, in order.
	Flags []string
	// Args are the arguments: for the JSON form the array's elements; for
	// the shell form of RUN, CMD and ENTRYPOINT one element, the command
	// line; for every other instruction the whitespace-separated words.
	Args []string
	// JSON is true for the JSON form (RUN ["a", "b"]).
	JSON bool
	// Raw is the text after the keyword and the flags, as written (with
	// line continuations joined).
	Raw string
	// Line is the 1-based line the instruction starts on.
	Line int
}

// Flag returns the value of the flag --name (and whether it is there).
func (in Instruction) Flag(name string) (string, bool) {
	for _, f := range in.Flags {
		k, v, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		if k == name {
			return v, true
		}
	}
	return "", false
}

// Stage is a build stage: a FROM and the instructions up to the next FROM.
type Stage struct {
	// Name is the stage's AS name (empty when it has none).
	Name string
	// Base is what FROM names, with the global ARGs' defaults expanded: an
	// image or another stage.
	Base string
	// Instructions follow the FROM, in order.
	Instructions []Instruction
	// Line is the FROM's line.
	Line int
}

// File is a parsed Dockerfile.
type File struct {
	// Args are the global ARGs (before the first FROM) with their defaults.
	Args map[string]string
	// Stages in the order they are declared.
	Stages []*Stage
}

// Stage returns the stage named name.
func (f *File) Stage(name string) (*Stage, bool) {
	for _, s := range f.Stages {
		if s.Name != "" && strings.EqualFold(s.Name, name) {
			return s, true
		}
	}
	return nil, false
}

// ParseFile reads the Dockerfile at path.
func ParseFile(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	f, err := Parse(fh)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

var directiveRE = regexp.MustCompile(`^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$`)

// Parse reads a Dockerfile.
func Parse(r io.Reader) (*File, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	escape := byte('\\')
	f := &File{Args: map[string]string{}}
	var (
		cur        strings.Builder // the logical line being joined
		start      int             // its first line
		lineNo     int
		directives = true // parser directives are only read before anything else
	)
	flush := func() error {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return nil
		}
		in, err := parseInstruction(text, start)
		if err != nil {
			return fmt.Errorf("line %d: %w", start, err)
		}
		return f.add(in)
	}
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if directives {
			if m := directiveRE.FindStringSubmatch(trimmed); m != nil {
				if strings.EqualFold(m[1], "escape") {
					if len(m[2]) != 1 || (m[2] != "\\" && m[2] != "`") {
						return nil, fmt.Errorf("line %d: escape directive %q: want \\ or `", lineNo, m[2])
					}
					escape = m[2][0]
				}
				continue
			}
			directives = false
		}
		// A comment line is dropped, also in the middle of a continuation.
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur.Len() == 0 {
			if trimmed == "" {
				continue
			}
			start = lineNo
		}
		if strings.HasSuffix(strings.TrimRight(line, " \t"), string(escape)) {
			l := strings.TrimRight(line, " \t")
			cur.WriteString(l[:len(l)-1])
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(line)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("line %d: the file ends inside a line continuation", start)
	}
	if len(f.Stages) == 0 {
		return nil, errors.New("no FROM instruction")
	}
	return f, nil
}

// add appends an instruction to the current stage, or opens a stage.
func (f *File) add(in Instruction) error {
	switch {
	case in.Cmd == "from":
		if len(in.Args) != 1 && (len(in.Args) != 3 || !strings.EqualFold(in.Args[1], "as")) {
			return fmt.Errorf("line %d: FROM wants <image> [AS <name>], got %q", in.Line, in.Args)
		}
		s := &Stage{Base: Expand(in.Args[0], f.Args), Line: in.Line}
		if len(in.Args) == 3 {
			s.Name = strings.ToLower(in.Args[2])
		}
		f.Stages = append(f.Stages, s)
	case len(f.Stages) == 0 && in.Cmd == "arg":
		for _, a := range in.Args {
			k, v, _ := strings.Cut(a, "=")
			f.Args[k] = unquote(v)
		}
	case len(f.Stages) == 0:
		return fmt.Errorf("line %d: %s before the first FROM", in.Line, strings.ToUpper(in.Cmd))
	default:
		s := f.Stages[len(f.Stages)-1]
		s.Instructions = append(s.Instructions, in)
	}
	return nil
}

// shellForm are the instructions whose shell form is one command line.
var shellForm = map[string]bool{"run": true, "cmd": true, "entrypoint": true, "shell": true, "healthcheck": true}

func parseInstruction(text string, line int) (Instruction, error) {
	kw, rest, _ := strings.Cut(text, " ")
	if i := strings.IndexAny(kw, "\t"); i >= 0 {
		kw, rest = kw[:i], kw[i+1:]+" "+rest
	}
	in := Instruction{Cmd: strings.ToLower(kw), Line: line}
	rest = strings.TrimSpace(rest)
	// Flags come first, on the instructions that take them.
	if in.Cmd == "from" || in.Cmd == "run" || in.Cmd == "copy" || in.Cmd == "add" || in.Cmd == "healthcheck" {
		for strings.HasPrefix(rest, "--") {
			flag, after, _ := strings.Cut(rest, " ")
			in.Flags = append(in.Flags, flag)
			rest = strings.TrimSpace(after)
		}
	}
	in.Raw = rest
	if strings.Contains(rest, "<<") && (in.Cmd == "run" || in.Cmd == "copy" || in.Cmd == "add") {
		return in, fmt.Errorf("%s with a heredoc: not supported by this reader", strings.ToUpper(in.Cmd))
	}
	if strings.HasPrefix(rest, "[") && (shellForm[in.Cmd] || in.Cmd == "copy" || in.Cmd == "add" || in.Cmd == "volume") {
		var arr []string
		if err := json.Unmarshal([]byte(rest), &arr); err == nil {
			in.Args, in.JSON = arr, true
			return in, nil
		}
		// Not valid JSON: Docker then takes the shell form, and so do we.
	}
	if shellForm[in.Cmd] {
		in.Args = []string{rest}
		return in, nil
	}
	in.Args = strings.Fields(rest)
	return in, nil
}

var varRE = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// Expand replaces $VAR and ${VAR} with their values in vars (empty when unset).
func Expand(s string, vars map[string]string) string {
	return varRE.ReplaceAllStringFunc(s, func(m string) string {
		name := strings.Trim(m, "${}")
		return vars[name]
	})
}

func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}
