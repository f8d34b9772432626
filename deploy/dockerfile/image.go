package dockerfile

import (
	"fmt"
	"path"
	"strings"

	"mvdan.cc/sh/v3/shell"
)

// Image is the configuration a stage gives its image: its own instructions
// applied over those of the stages it is built FROM.
type Image struct {
	Env        map[string]string
	Entrypoint []string
	Cmd        []string
	// Expose holds the EXPOSE ports as written ("8080", "4222/tcp").
	Expose  []string
	Workdir string
	User    string
}

// Chain returns the stages that s is built on, the first one first, s last.
// A FROM that names no stage of the file is an image and ends the chain.
func (f *File) Chain(s *Stage) ([]*Stage, error) {
	var chain []*Stage
	seen := map[*Stage]bool{}
	for cur := s; cur != nil; {
		if seen[cur] {
			return nil, fmt.Errorf("stage %q is built from itself", s.Name)
		}
		seen[cur] = true
		chain = append([]*Stage{cur}, chain...)
		next, ok := f.Stage(cur.Base)
		if !ok {
			break
		}
		cur = next
	}
	return chain, nil
}

// Image returns the configuration of the image that stage s builds.
func (f *File) Image(s *Stage) (Image, error) {
	chain, err := f.Chain(s)
	if err != nil {
		return Image{}, err
	}
	img := Image{Env: map[string]string{}, Workdir: "/"}
	for _, st := range chain {
		// An ENTRYPOINT set in a stage drops the CMD inherited from its base.
		cmdSet := false
		for _, in := range st.Instructions {
			switch in.Cmd {
			case "env":
				kv, err := EnvPairs(in, img.Env)
				if err != nil {
					return Image{}, fmt.Errorf("line %d: %w", in.Line, err)
				}
				for k, v := range kv {
					img.Env[k] = v
				}
			case "entrypoint":
				img.Entrypoint = execForm(in)
				if !cmdSet {
					img.Cmd = nil
				}
			case "cmd":
				img.Cmd, cmdSet = execForm(in), true
			case "expose":
				img.Expose = append(img.Expose, in.Args...)
			case "workdir":
				if len(in.Args) > 0 {
					dir := Expand(in.Args[0], img.Env)
					if !path.IsAbs(dir) {
						dir = path.Join(img.Workdir, dir)
					}
					img.Workdir = dir
				}
			case "user":
				if len(in.Args) > 0 {
					img.User = in.Args[0]
				}
			}
		}
	}
	return img, nil
}

// EnvPairs reads an ENV instruction: key=value pairs (quoted as in a shell),
// or the legacy "ENV key value". $VAR takes its value from vars.
func EnvPairs(in Instruction, vars map[string]string) (map[string]string, error) {
	// Split and unquote first, then expand: Docker does not split a value
	// on the spaces a variable brings in.
	words, err := shell.Fields(in.Raw, func(name string) string {
		if name == "IFS" { // the splitting itself: the default
			return ""
		}
		return "${" + name + "}"
	})
	if err != nil {
		return nil, fmt.Errorf("ENV %q: %w", in.Args, err)
	}
	for i, w := range words {
		words[i] = Expand(w, vars)
	}
	out := map[string]string{}
	if len(words) > 0 && !strings.Contains(words[0], "=") {
		out[words[0]] = strings.Join(words[1:], " ")
		return out, nil
	}
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			return nil, fmt.Errorf("ENV %q: %q is not key=value", in.Args, w)
		}
		out[k] = v
	}
	return out, nil
}

// execForm returns the argv that CMD or ENTRYPOINT runs.
func execForm(in Instruction) []string {
	if in.JSON {
		return in.Args
	}
	return []string{"/bin/sh", "-c", strings.Join(in.Args, " ")}
}
