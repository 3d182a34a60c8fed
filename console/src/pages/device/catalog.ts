/** The firmware catalog (docs/api.md, "GET /0/firmware/"), for the catalog page and a device's update. */
export interface Image {
  name: string;
  platform: string;
  version: number;
  info: { platforms: { from: string[]; to: { platform: string; name: string } } };
}
