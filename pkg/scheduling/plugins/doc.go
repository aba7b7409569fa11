// Package plugins is the home of kvroute's in-tree scheduling plugins, one
// small package each: scorers, filters, pickers, profile handlers and
// post-pick hooks. Each package exports its kebab-case Type, a constructor,
// and a Factory that pkg/scheduling/config registers under Type.
package plugins
