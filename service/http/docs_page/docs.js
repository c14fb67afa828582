// Renders the server's own OpenAPI document (fetched from openapi.json, next to this page) as plain HTML.
// Shipped inside the glassbox package and inlined into /docs: no CDN, no framework, works offline.
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function refName(schema) {
  return schema && typeof schema.$ref === "string" ? schema.$ref.split("/").pop() : null;
}

function schemaLink(schema) {
  const name = refName(schema);
  if (name) return el("a", { href: "#schema-" + name }, el("code", {}, name));
  return el("code", {}, JSON.stringify(schema || {}));
}

function contentTable(content) {
  const table = el("table", {}, el("tr", {}, el("th", {}, "media type"), el("th", {}, "schema")));
  for (const [media, body] of Object.entries(content || {})) {
    table.append(el("tr", {}, el("td", {}, el("code", {}, media)), el("td", {}, schemaLink(body.schema))));
  }
  return table;
}

function operationBlock(path, method, op) {
  const body = el("div", {});
  if (op.description) body.append(el("p", {}, op.description));
  const params = op.parameters || [];
  if (params.length) {
    const table = el("table", {}, el("tr", {}, el("th", {}, "parameter"), el("th", {}, "in"),
                                     el("th", {}, "required"), el("th", {}, "schema")));
    for (const p of params) {
      table.append(el("tr", {}, el("td", {}, el("code", {}, p.name)), el("td", {}, p.in),
                      el("td", {}, p.required ? "yes" : "no"), el("td", {}, schemaLink(p.schema))));
    }
    body.append(el("h4", {}, "Parameters"), table);
  }
  if (op.requestBody) body.append(el("h4", {}, "Request body"), contentTable(op.requestBody.content));
  const responses = el("table", {}, el("tr", {}, el("th", {}, "status"), el("th", {}, "description"),
                                       el("th", {}, "body")));
  for (const [status, response] of Object.entries(op.responses || {})) {
    const bodies = el("td", {});
    for (const [media, content] of Object.entries(response.content || {})) {
      bodies.append(el("code", {}, media), " ", schemaLink(content.schema), el("br", {}));
    }
    responses.append(el("tr", {}, el("td", {}, el("code", {}, status)), el("td", {}, response.description || ""),
                         bodies));
  }
  body.append(el("h4", {}, "Responses"), responses);
  const summary = el("summary", {}, el("span", { class: "method " + method }, method.toUpperCase()),
                     el("span", { class: "path" }, path),
                     op.summary ? el("span", { class: "muted" }, "  " + op.summary) : null);
  return el("details", { class: "operation", id: "op-" + (op.operationId || method + path) }, summary, body);
}

function render(doc) {
  document.getElementById("title").textContent = (doc.info.title || "API") + " " + (doc.info.version || "");
  const summary = document.getElementById("summary");
  summary.replaceChildren(doc.info.description || "", " ", el("a", { href: "openapi.json" }, "openapi.json"));
  const operations = document.getElementById("operations");
  operations.append(el("h2", {}, "Routes"));
  for (const [path, item] of Object.entries(doc.paths || {})) {
    for (const [method, op] of Object.entries(item)) {
      if (typeof op === "object" && op.responses) operations.append(operationBlock(path, method, op));
    }
  }
  const schemas = document.getElementById("schemas");
  schemas.append(el("h2", {}, "Schemas"));
  for (const [name, schema] of Object.entries((doc.components || {}).schemas || {})) {
    schemas.append(el("h3", { id: "schema-" + name }, name), el("pre", {}, JSON.stringify(schema, null, 2)));
  }
  document.getElementById("index").append(el("a", { href: "#operations" }, "routes"),
                                          el("a", { href: "#schemas" }, "schemas"));
}

fetch("openapi.json", { headers: { Accept: "application/json" } })
  .then((response) => {
    if (!response.ok) throw new Error("GET openapi.json answered " + response.status);
    return response.json();
  })
  .then(render)
  .catch((error) => {
    document.getElementById("summary").replaceChildren(el("span", { class: "error" }, String(error)));
  });
