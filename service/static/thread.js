// The thread view of the mission page: parent links up to the root, then every reply below.
import { $, api, el } from "./api.js";
import { answerNode } from "./text.js";

// NOTE: the page's own lookups are passed in, so the view reads the items the page keeps.
export function threadView({ itemOf, childrenOf, drops, stateClass }) {
  let open = null;

  async function ancestors(promptId) {
    const chain = [];
    let id = promptId;
    while (id) {
      let item = itemOf(id);
      if (!item) {
        // NOTE: a parent older than the page's snapshot (archived, or another user's) is read
        // once; a response leads to its prompt.
        try {
          const answer = await api("GET", `/responses/${id}`).catch(() => null);
          if (answer) id = answer.parent_id;
          const found = await api("GET", `/prompts/${id}`);
          const job = found.jobs[0] || {};
          item = { prompt_id: id, parent_id: found.prompt.parent_id, text: found.prompt.content,
                   state: job.state, response_text: found.response ? found.response.content : null };
        } catch {
          break;
        }
      }
      chain.unshift(item);
      id = item.parent_id;
    }
    return chain;
  }

  function entry(item, depth) {
    return el("li", { class: `thread-item ${stateClass[item.state] || ""}`,
                      "data-depth": String(Math.min(depth, 6)), "data-prompt-id": item.prompt_id },
      el("p", { class: "prompt-text", text: item.text }),
      item.response_text ? answerNode(item.response_text, "response-text") : null,
      el("span", { class: "state", text: item.state || "unknown" }));
  }

  async function render() {
    const target = open;
    const chain = await ancestors(target);
    if (open !== target) return;
    const entries = chain.map((item, depth) => entry(item, depth));
    const below = (id, depth) => {
      for (const child of childrenOf(id).sort((a, b) => (a.created_at < b.created_at ? -1 : 1))) {
        entries.push(entry(child, depth));
        below(child.prompt_id, depth + 1);
      }
    };
    below(target, chain.length);
    $("thread-list").replaceChildren(...entries);
  }

  return {
    async show(promptId) {
      open = promptId;
      $("thread").hidden = false;
      await render();
      $("thread").focus();
    },
    close() {
      if (open === null) return;
      const from = open;
      open = null;
      $("thread").hidden = true;
      if (drops.has(from)) drops.get(from).focus();
    },
    refresh() {
      if (open !== null) render();
    },
  };
}
