// Gives @huggingface/jinja Python Jinja2's str.strip, lstrip and rstrip,
// which take the characters to remove (Qwen3's template strips only
// newlines); @huggingface/jinja ignores that argument and strips all
// whitespace.
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { Environment } = require("@huggingface/jinja");

export function patchStringStrip() {
  const env = new Environment();
  env.set("probe", "x");
  const proto = Object.getPrototypeOf(env.lookupVariable("probe"));
  const desc = Object.getOwnPropertyDescriptor(proto, "builtins");
  const FunctionValue = desc.get.call(env.lookupVariable("probe")).get("upper").constructor;
  const StringValue = proto.constructor;
  const strip = (s, chars, left, right) => {
    const set = chars == null ? null : new Set(Array.from(chars));
    const drop = (c) => (set ? set.has(c) : /[\s\u001c-\u001f\u0085]/u.test(c));
    const cs = Array.from(s);
    let a = 0, b = cs.length;
    while (left && a < b && drop(cs[a])) a++;
    while (right && b > a && drop(cs[b - 1])) b--;
    return cs.slice(a, b).join("");
  };
  Object.defineProperty(proto, "builtins", {
    get() {
      const m = desc.get.call(this);
      const arg = (args) => (args.length > 0 && args[0].type === "StringValue" ? args[0].value : null);
      m.set("strip", new FunctionValue((args) => new StringValue(strip(this.value, arg(args), true, true))));
      m.set("lstrip", new FunctionValue((args) => new StringValue(strip(this.value, arg(args), true, false))));
      m.set("rstrip", new FunctionValue((args) => new StringValue(strip(this.value, arg(args), false, true))));
      return m;
    },
  });
}

