// The types the generated files check glassbox's dashboards against. Everything Grafana defines comes from
// @grafana/schema (pinned to the Grafana image in compose.yaml); the only local additions are the Prometheus query
// and annotation fields, which Grafana types in @grafana/prometheus (a React package far too heavy to install for
// a type check) rather than in the schema.
import type { AnnotationQuery, AnnotationTarget, DataQuery, Dashboard } from '@grafana/schema';
import type * as heatmap from '@grafana/schema/dist/esm/raw/composable/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen.js';
import type * as stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen.js';
import type * as table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen.js';
import type * as stateTimeline from '@grafana/schema/dist/esm/raw/composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen.js';
import type * as timeseries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen.js';

// Dashboard JSON holds plain strings where the schema declares TypeScript string enums, and a string literal is
// not assignable to an enum type. Loose<T> swaps every string enum for the union of its values (`${E}`), which
// is exactly what the JSON may hold, and leaves everything else as strict as the schema made it: required
// fields stay required, unknown fields in object literals stay errors, other strings must match their literals.
export type Loose<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends ReadonlyArray<infer U>
      ? Array<Loose<U>>
      : T extends object
        ? { [K in keyof T]: Loose<T[K]> }
        : T;

// A Prometheus query as Grafana's Prometheus data source stores it (PromQuery in @grafana/prometheus).
export interface PromTarget extends DataQuery {
  expr: string;
  legendFormat?: string;
  format?: 'time_series' | 'table' | 'heatmap';
  instant?: boolean;
  range?: boolean;
  exemplar?: boolean;
  interval?: string;
  intervalFactor?: number;
  editorMode?: 'code' | 'builder';
}

// A Prometheus annotation: the query goes in `target`; how a matching series becomes an event sits beside it
// (@grafana/data's AnnotationQuery has an index signature for these; the Prometheus annotation editor writes them).
export interface PromAnnotationFields {
  titleFormat?: string;
  textFormat?: string;
  tagKeys?: string;
  useValueForTime?: boolean;
  step?: string;
}

// Annotations stored in Grafana itself (posted to its API, e.g. by `glassbox chaos run --grafana-url`), picked by
// tags: the schema's own AnnotationTarget, on Grafana's built-in data source.
export type TagAnnotation = Loose<Omit<AnnotationQuery, 'target'>> & { target: Loose<AnnotationTarget> };

// Grafana's built-in "Annotations & Alerts" entry fits the first type too (it has no target).
export type GlassboxAnnotation = (Loose<AnnotationQuery<PromTarget>> & PromAnnotationFields) | TagAnnotation;

export type GlassboxDashboard = Omit<Loose<Dashboard>, 'annotations'> & {
  annotations?: { list?: GlassboxAnnotation[] };
};

// Per panel type: its plugin's options and custom field config, and its queries. A panel type missing here is a
// type error in the generated file, so a new visualisation gets its schema added before it can pass.
export interface PanelChecks {
  timeseries: { options: Loose<timeseries.Options>; custom: Loose<timeseries.FieldConfig>; targets: PromTarget[] };
  heatmap: { options: Loose<heatmap.Options>; custom: Loose<heatmap.FieldConfig>; targets: PromTarget[] };
  stat: { options: Loose<stat.Options>; custom: Record<string, never>; targets: PromTarget[] };
  table: { options: Loose<table.Options>; custom: Loose<table.FieldConfig>; targets: PromTarget[] };
  'state-timeline': {
    options: Loose<stateTimeline.Options>;
    custom: Loose<stateTimeline.FieldConfig>;
    targets: PromTarget[];
  };
}
