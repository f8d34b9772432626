package secrets

import "sort"

// matcher finds every occurrence of a set of patterns in one pass over a
// string (Aho-Corasick). It is built once per scrubber; a scan allocates
// nothing unless a pattern occurs.
//
// Node 0 is the root. The root's transitions are a dense table; every other
// node's children are a list (first, then next; most nodes have one child),
// so that building allocates a few arrays, not one table per node. A child
// is never the root, so 0 means "none".
type matcher struct {
	root  [256]int32
	key   []byte  // the byte that leads to the node
	first []int32 // the node's first child
	next  []int32 // the node's next sibling
	fail  []int32
	// outLen and outID: the longest pattern that is a suffix of the node's
	// string (0: none), and the id its pattern was added with.
	outLen []int32
	outID  []int32
}

// match is one occurrence: s[start:end] is a pattern of id.
type match struct {
	start, end int
	id         int32
}

// newMatcher builds a matcher of patterns; ids[i] is the id of patterns[i].
// A pattern given twice keeps its first id. Empty patterns are ignored.
func newMatcher(patterns []string, ids []int32) *matcher {
	total := 1
	for _, p := range patterns {
		total += len(p)
	}
	m := &matcher{
		key:   make([]byte, 1, total),
		first: make([]int32, 1, total),
		next:  make([]int32, 1, total),
	}
	term := make([]int32, 1, total) // the pattern id ending at the node, -1: none
	depth := make([]int32, 1, total)
	term[0] = -1
	for pi, p := range patterns {
		n := int32(0)
		for i := 0; i < len(p); i++ {
			c := p[i]
			child := m.child(n, c)
			if n == 0 {
				child = m.root[c]
			}
			if child == 0 {
				child = int32(len(m.key))
				m.key = append(m.key, c)
				m.first = append(m.first, 0)
				m.next = append(m.next, m.first[n])
				m.first[n] = child
				term = append(term, -1)
				depth = append(depth, depth[n]+1)
				if n == 0 {
					m.root[c] = child
				}
			}
			n = child
		}
		if n != 0 && term[n] < 0 {
			term[n] = ids[pi]
		}
	}
	size := len(m.key)
	m.fail = make([]int32, size)
	m.outLen = make([]int32, size)
	m.outID = make([]int32, size)
	// Breadth first: a node's failure link is shallower, so already set.
	queue := make([]int32, 0, size)
	for c := m.first[0]; c != 0; c = m.next[c] {
		queue = append(queue, c) // fail 0
	}
	for qi := 0; qi < len(queue); qi++ {
		n := queue[qi]
		if term[n] >= 0 {
			m.outLen[n], m.outID[n] = depth[n], term[n]
		} else {
			m.outLen[n], m.outID[n] = m.outLen[m.fail[n]], m.outID[m.fail[n]]
		}
		for c := m.first[n]; c != 0; c = m.next[c] {
			m.fail[c] = m.step(m.fail[n], m.key[c])
			queue = append(queue, c)
		}
	}
	return m
}

// child is n's child by c, 0 when it has none (n is not the root).
func (m *matcher) child(n int32, c byte) int32 {
	for ch := m.first[n]; ch != 0; ch = m.next[ch] {
		if m.key[ch] == c {
			return ch
		}
	}
	return 0
}

// step is the automaton's transition from n by c.
func (m *matcher) step(n int32, c byte) int32 {
	for n != 0 {
		if t := m.child(n, c); t != 0 {
			return t
		}
		n = m.fail[n]
	}
	return m.root[c]
}

// any reports whether a pattern occurs in s.
func (m *matcher) any(s string) bool {
	n := int32(0)
	for i := 0; i < len(s); i++ {
		if n == 0 {
			// The root, where a scan spends most bytes: one table look-up.
			if n = m.root[s[i]]; n == 0 {
				continue
			}
		} else {
			n = m.step(n, s[i])
		}
		if m.outLen[n] != 0 {
			return true
		}
	}
	return false
}

// find returns, for every end position where a pattern ends, the longest
// pattern ending there, sorted by start and then longest first. Every
// occurrence of every pattern lies inside one of them.
func (m *matcher) find(s string) []match {
	var out []match
	n := int32(0)
	for i := 0; i < len(s); i++ {
		if n == 0 {
			if n = m.root[s[i]]; n == 0 {
				continue
			}
		} else {
			n = m.step(n, s[i])
		}
		if l := m.outLen[n]; l != 0 {
			out = append(out, match{start: i + 1 - int(l), end: i + 1, id: m.outID[n]})
		}
	}
	if len(out) < 2 {
		return out
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].start != out[j].start {
			return out[i].start < out[j].start
		}
		return out[i].end > out[j].end
	})
	return out
}
